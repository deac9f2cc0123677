//! CSV rows -> the chart: panels (`--facet`), groups along x, one bar or point a series in
//! each group, and each engine's speedup over HF's in the group.
//!
//! A series is an engine (× precision, × every other workload column that varies and is not x
//! or the facet), so a bar never folds rows of two workloads: it is the median of repeats,
//! with their min..max, or one run with its bootstrap interval ([`super::whiskers`]). An engine's settings and build (HF's attention, candle's `--fused`
//! set, the commit) do not split bars unless `--all-configs`: each bar keeps its engine's
//! newest, as a published chart shows the current build, and a note counts what was left out.

use super::args::Args;
use super::chart::{Chart, Group, Panel, Point, Series, Speedup};
use super::fields::{self, units, CONFIG, LOAD, SERVING, SWEPT, WORKLOAD};
use super::select::{kept_rows, number_column, text_column};
use super::whiskers::{self, Bounds, RowPoint};
use crate::error::{Error, Result};
use crate::report::row::column_names;
use polars::prelude::*;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

/// Which column plays which part: the panels, the groups (x, then the batch size where x is
/// the model and it varies), the series (engine first).
pub(super) struct Layout {
    pub facet: Option<String>,
    pub group: Vec<String>,
    pub series: Vec<String>,
    pub lines: bool,
}

/// The text columns the chart reads, by name.
pub(super) type Cols = HashMap<String, Vec<Option<String>>>;

pub(super) fn read_cols(df: &DataFrame, args: &Args) -> Result<Cols> {
    let mut cols = Cols::new();
    let extra = ["engine", "time_utc", args.x.as_str(), args.facet.as_str()];
    let curve = LOAD.iter().chain(SERVING);
    for c in WORKLOAD.iter().chain(CONFIG).chain(&extra).chain(curve) {
        cols.insert(c.to_string(), text_column(df, c)?);
    }
    Ok(cols)
}

pub(super) fn varies(col: &[Option<String>], rows: &[usize]) -> bool {
    rows.iter().any(|&i| col[i] != col[rows[0]])
}

pub(super) fn layout(cols: &Cols, rows: &[usize], args: &Args) -> Layout {
    let x = args.x.as_str();
    let facet = match args.facet.as_str() {
        "none" => None,
        // By GPU where several; lines of several models apart too (one hue an engine would
        // leave them told apart by shade only).
        "auto" => ["gpu", "model"]
            .into_iter()
            .filter(|c| *c == "gpu" || SWEPT.contains(&x))
            .find(|c| *c != x && varies(&cols[*c], rows))
            .map(str::to_string),
        f => Some(f.to_string()),
    };
    let mut group = vec![x.to_string()];
    let bs_varies = varies(&cols["batch_size"], rows);
    if x == "model" && bs_varies && facet.as_deref() != Some("batch_size") {
        group.push("batch_size".into());
    }
    let taken = |c: &str| group.iter().any(|g| g == c) || facet.as_deref() == Some(c);
    let mut series = vec!["engine".to_string()];
    let config: &[&str] = if args.all_configs { CONFIG } else { &[] };
    for c in WORKLOAD.iter().chain(config) {
        if !taken(c) && varies(&cols[*c], rows) {
            series.push(c.to_string());
        }
    }
    let lines = SWEPT.contains(&x);
    Layout {
        facet,
        group,
        series,
        lines,
    }
}

pub(super) fn key(cols: &Cols, names: &[String], i: usize) -> Vec<Option<String>> {
    names.iter().map(|c| cols[c][i].clone()).collect()
}

/// Keeps, for each bar, the rows of its engine's newest settings and build (the latest
/// `time_utc`, then the last row); returns them and how many rows were left out.
pub(super) fn newest(cols: &Cols, rows: Vec<usize>, lay: &Layout) -> (Vec<usize>, usize) {
    let config: Vec<String> = CONFIG.iter().map(|c| c.to_string()).collect();
    let bar = |i: usize| {
        let mut k = key(cols, &lay.group, i);
        k.extend(key(cols, &lay.series, i));
        k.push(lay.facet.as_ref().and_then(|f| cols[f][i].clone()));
        k
    };
    let mut chosen: HashMap<Vec<Option<String>>, (Option<String>, usize)> = HashMap::new();
    for &i in &rows {
        let when = (cols["time_utc"][i].clone(), i);
        let best = chosen.entry(bar(i)).or_insert(when.clone());
        if when > *best {
            *best = when;
        }
    }
    let kept: Vec<usize> = rows
        .iter()
        .copied()
        .filter(|&i| key(cols, &config, i) == key(cols, &config, chosen[&bar(i)].1))
        .collect();
    let dropped = rows.len() - kept.len();
    (kept, dropped)
}

/// Numbers as numbers, the rest as text.
fn cmp_values(a: &Option<String>, b: &Option<String>) -> Ordering {
    let num = |v: &Option<String>| v.as_deref().and_then(|s| s.parse::<f64>().ok());
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        _ => a.cmp(b),
    }
}

pub(super) type Key = Vec<Option<String>>;

/// The series in legend order: candle, other engines, HF; then by their other columns.
pub(super) fn series_keys(cols: &Cols, rows: &[usize], lay: &Layout) -> Vec<Key> {
    let mut keys: Vec<Key> = vec![];
    for &i in rows {
        let k = key(cols, &lay.series, i);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let rank = |k: &Key| fields::engine_rank(k[0].as_deref().unwrap_or(""));
    keys.sort_by(|a, b| {
        let by_value = a.iter().zip(b).map(|(x, y)| cmp_values(x, y));
        rank(a)
            .cmp(&rank(b))
            .then_with(|| by_value.fold(Ordering::Equal, Ordering::then))
    });
    keys
}

/// A series' legend text: the values of the columns that vary among the series, less those
/// that go without saying (tp1) where something else is said.
fn series_label(k: &Key, lay: &Layout, shown: &[bool], all_fused: &[String]) -> String {
    let parts = |quiet: bool| -> Vec<String> {
        let named = lay.series.iter().zip(k).zip(shown).filter(|(_, s)| **s);
        named
            .filter_map(|((c, v), _)| {
                let v = v.as_deref()?;
                let unsaid = quiet && fields::is_default(c, v);
                (!unsaid).then(|| fields::show(c, v, all_fused))
            })
            .collect()
    };
    let mut p = parts(true);
    if p.is_empty() {
        p = parts(false);
    }
    if p.is_empty() {
        p.extend(k[0].clone());
    }
    p.join(" ")
}

/// Legend entries: one hue an engine (× precision where it varies), a shade per variant.
pub(super) fn series_list(keys: &[Key], lay: &Layout, all_fused: &[String]) -> Vec<Series> {
    let shown: Vec<bool> = (0..lay.series.len())
        .map(|c| keys.iter().any(|k| k[c] != keys[0][c]))
        .collect();
    let dtype = lay.series.iter().position(|c| c == "dtype");
    let hue_of = |k: &Key| (k[0].clone(), dtype.and_then(|d| k[d].clone()));
    let mut hues = vec![];
    keys.iter()
        .enumerate()
        .map(|(s, k)| {
            let h = hue_of(k);
            if !hues.contains(&h) {
                hues.push(h.clone());
            }
            Series {
                label: series_label(k, lay, &shown, all_fused),
                hue: hues.iter().position(|x| *x == h).unwrap_or(0),
                shade: keys[..s].iter().filter(|o| hue_of(o) == h).count(),
                baseline: fields::is_baseline(k[0].as_deref().unwrap_or("")),
            }
        })
        .collect()
}

/// The groups along x in order: models by size (`n_parameters`), numbers as numbers, other
/// text as first seen; then the batch size.
fn group_keys(df: &DataFrame, cols: &Cols, rows: &[usize], lay: &Layout) -> Result<Vec<Key>> {
    let params = number_column(df, "n_parameters")?;
    let mut rank: HashMap<Option<String>, f64> = HashMap::new();
    let x = &cols[&lay.group[0]];
    let all_numbers = rows
        .iter()
        .all(|&i| x[i].as_deref().is_some_and(|v| v.parse::<f64>().is_ok()));
    for (n, &i) in rows.iter().enumerate() {
        let r = match (&params, lay.group[0].as_str()) {
            _ if all_numbers => x[i].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0.),
            (Some(p), "model") => p[i].unwrap_or(f64::INFINITY),
            _ => n as f64,
        };
        let e = rank.entry(x[i].clone()).or_insert(r);
        *e = e.min(r);
    }
    let mut keys: Vec<Key> = vec![];
    for &i in rows {
        let k = key(cols, &lay.group, i);
        if !keys.contains(&k) && k[0].is_some() {
            keys.push(k);
        }
    }
    keys.sort_by(|a, b| {
        let rest = a[1..].iter().zip(&b[1..]).map(|(x, y)| cmp_values(x, y));
        rank[&a[0]]
            .total_cmp(&rank[&b[0]])
            .then_with(|| rest.fold(Ordering::Equal, Ordering::then))
    });
    Ok(keys)
}

/// Whether more of the metric is better (rates), less (times), or neither (memory, loss):
/// only the first two get a speedup.
fn higher_is_better(metric: &str) -> Option<bool> {
    if metric.contains("per_second") || metric.contains("tflop") {
        Some(true)
    } else if metric.contains("_ms") || metric.ends_with("seconds") || metric.ends_with("runtime") {
        Some(false)
    } else {
        None
    }
}

/// Each non-HF series' speedup over the best HF series of the same workload in the group.
fn speedups(points: &[(usize, Point)], keys: &[Key], lay: &Layout, metric: &str) -> Vec<Speedup> {
    let Some(higher) = higher_is_better(metric) else {
        return vec![];
    };
    // The workload a series runs: its key less the engine and the engine's settings.
    let workload = |s: usize| -> Vec<&Option<String>> {
        let named = lay.series.iter().zip(&keys[s]).skip(1);
        named
            .filter(|(c, _)| !CONFIG.contains(&c.as_str()))
            .map(|(_, v)| v)
            .collect()
    };
    let is_hf = |s: usize| fields::is_baseline(keys[s][0].as_deref().unwrap_or(""));
    let mut out = vec![];
    for &(s, p) in points.iter().filter(|(s, _)| !is_hf(*s)) {
        let base = points
            .iter()
            .filter(|(b, _)| is_hf(*b) && workload(*b) == workload(s))
            .max_by(|x, y| {
                let o = x.1.value.total_cmp(&y.1.value);
                if higher {
                    o
                } else {
                    o.reverse()
                }
            });
        if let Some(&(b, bp)) = base {
            let ratio = if higher {
                p.value / bp.value
            } else {
                bp.value / p.value
            };
            if ratio.is_finite() {
                out.push(Speedup {
                    series: s,
                    baseline: b,
                    ratio,
                });
            }
        }
    }
    out
}

/// The metric's values; an error for a column that is missing or holds no number.
pub(super) fn metric_values(df: &DataFrame, args: &Args) -> Result<Vec<Option<f64>>> {
    let Some(value) = number_column(df, &args.metric)? else {
        return Err(Error::Config(format!(
            "no column '{}' in {} (columns: {})",
            args.metric,
            args.input.display(),
            column_names(df)
        )));
    };
    // An infinite cell (text such as `inf` reads as a number) cannot be drawn.
    let value: Vec<Option<f64>> = value
        .into_iter()
        .map(|v| v.filter(|x| x.is_finite()))
        .collect();
    if value.iter().all(Option::is_none) {
        return Err(Error::Config(format!(
            "column '{}' of {} holds no numbers: --metric takes a numeric column",
            args.metric,
            args.input.display()
        )));
    }
    for (flag, c) in [("--x", &args.x), ("--facet", &args.facet)] {
        if !matches!(c.as_str(), "auto" | "none") && df.column(c).is_err() {
            return Err(Error::Config(format!(
                "{flag} {c}: no such column (columns: {})",
                column_names(df)
            )));
        }
    }
    Ok(value)
}

/// What every plotted row shares, for the subtitle: `generation · bf16 · batch 16`.
pub(super) fn subtitle(cols: &Cols, rows: &[usize], lay: &Layout) -> String {
    let taken = |c: &str| lay.facet.as_deref() == Some(c) || lay.group.iter().any(|g| g == c);
    let shared = ["engine"].iter().chain(WORKLOAD).filter(|c| !taken(c));
    shared
        .filter_map(|c| {
            let col = &cols[*c];
            let v = col[rows[0]].as_deref()?;
            let quiet = varies(col, rows) || fields::is_default(c, v);
            (!quiet).then(|| fields::show(c, v, &[]))
        })
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The chart's data from the CSV and the flags (bars or lines; `--curve` is
/// [`super::curve`]'s).
pub fn build(df: &DataFrame, args: &Args) -> Result<Chart> {
    let value = metric_values(df, args)?;
    let rows = kept_rows(df, args, &value)?;
    let cols = read_cols(df, args)?;
    let lay = layout(&cols, &rows, args);
    let (rows, dropped) = match args.all_configs {
        true => (rows, 0),
        false => newest(&cols, rows, &lay),
    };
    let all_fused = fields::fused_union(rows.iter().filter_map(|&i| cols["fused"][i].as_deref()));
    let keys = series_keys(&cols, &rows, &lay);
    let groups = group_keys(df, &cols, &rows, &lay)?;
    let mut facets: Vec<Option<String>> = vec![];
    for &i in &rows {
        let f = lay.facet.as_ref().and_then(|f| cols[f][i].clone());
        if !facets.contains(&f) {
            facets.push(f);
        }
    }
    facets.sort_by(cmp_values);
    let bounds = Bounds::read(df, &args.metric)?;
    let (_, scale) = units(&args.metric);
    let mut raw: BTreeMap<(usize, usize, usize), Vec<RowPoint>> = BTreeMap::new();
    for &i in &rows {
        let v = value[i].unwrap_or(f64::NAN);
        let Some(g) = groups.iter().position(|k| *k == key(&cols, &lay.group, i)) else {
            continue; // no x value: nowhere to draw it
        };
        let f = lay.facet.as_ref().and_then(|f| cols[f][i].clone());
        let p = facets.iter().position(|x| *x == f).unwrap_or(0);
        let s = keys
            .iter()
            .position(|k| *k == key(&cols, &lay.series, i))
            .unwrap_or(0);
        raw.entry((p, g, s))
            .or_default()
            .push(bounds.row(i, v, scale));
    }
    let drawn: Vec<_> = raw.values().map(|r| whiskers::fold(r)).collect();
    let whiskers: Vec<_> = drawn
        .iter()
        .filter(|(p, _)| p.hi > p.lo)
        .map(|w| w.1)
        .collect();
    let panels = facets
        .iter()
        .enumerate()
        .map(|(p, f)| panel(p, f, &raw, &groups, &keys, &lay, args))
        .collect();
    Ok(Chart {
        panels,
        series: series_list(&keys, &lay, &all_fused),
        lines: lay.lines,
        curve: false,
        x_label: if lay.lines {
            args.x.replace('_', " ")
        } else {
            String::new()
        },
        subtitle: subtitle(&cols, &rows, &lay),
        error_bars: whiskers::note(&whiskers).filter(|_| !lay.lines),
        note: (dropped > 0).then(|| {
            let what = if lay.lines { "point" } else { "bar" };
            format!(
                "each {what}: its engine's newest settings and build ({dropped} older runs not \
                 drawn; --all-configs draws every one)"
            )
        }),
    })
}

/// Panel `p`: its groups (those with a point), each with its points and speedups.
fn panel(
    p: usize,
    facet: &Option<String>,
    raw: &BTreeMap<(usize, usize, usize), Vec<RowPoint>>,
    groups: &[Key],
    keys: &[Key],
    lay: &Layout,
    args: &Args,
) -> Panel {
    let mut out = vec![];
    for (g, gk) in groups.iter().enumerate() {
        let points: Vec<(usize, Point)> = (0..keys.len())
            .filter_map(|s| raw.get(&(p, g, s)).map(|rows| (s, whiskers::fold(rows).0)))
            .collect();
        if points.is_empty() {
            continue;
        }
        let shown = lay.group.iter().zip(gk).filter_map(|(c, v)| {
            let v = v.as_deref()?;
            Some(if lay.lines {
                v.to_string()
            } else {
                fields::show(c, v, &[])
            })
        });
        let x = match lay.lines {
            true => gk[0].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0.),
            false => out.len() as f64,
        };
        out.push(Group {
            label: shown.collect::<Vec<_>>().join("\n"),
            x,
            speedups: speedups(&points, keys, lay, &args.metric),
            points,
        });
    }
    let label = lay.facet.as_ref().zip(facet.as_deref());
    Panel {
        label: label.map(|(c, v)| fields::show(c, v, &[])),
        groups: out,
    }
}
