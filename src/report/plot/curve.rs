//! Latency–throughput curves (`plot --curve`), as `vllm bench sweep` plots a rate sweep: x a
//! measured number (`--x requests_per_second`, `output_tokens_per_second`), y the metric (a
//! latency such as `ttft_ms_p99`). A point is one offered load of one series: a serving run,
//! or the median of its repeats (x and y each the median, y's min..max as an error bar). A
//! series is a configuration (engine, model, batch size… as for lines, plus the serving load's
//! shape: batching, burstiness, lengths, SLO), its points joined in x order. The offered load
//! (`request_rate`, `max_concurrency`: [`LOAD`]) runs along the line and labels each point.

use super::args::Args;
use super::chart::{Chart, Group, Panel};
use super::fields::{self, LOAD, SERVING};
use super::select::{kept_rows, number_column};
use super::series::{
    key, layout, metric_values, newest, read_cols, series_keys, series_list, subtitle, varies,
    Cols, Key, Layout,
};
use super::whiskers::{self, Bounds, RowPoint};
use crate::error::{Error, Result};
use polars::prelude::*;
use std::collections::BTreeMap;

/// The x column's numbers; a one-line error where it holds none.
fn x_values(df: &DataFrame, args: &Args) -> Result<Vec<Option<f64>>> {
    let xs = number_column(df, &args.x)?.unwrap_or_default();
    match xs.iter().any(Option::is_some) {
        true => Ok(xs),
        false => Err(Error::Config(format!(
            "--curve --x {}: not a numeric column of {}; give a measured one such as requests_per_second or output_tokens_per_second",
            args.x,
            args.input.display()
        ))),
    }
}

/// The lines' layout: the offered load along each line, the series as for lines plus the
/// serving columns that vary.
fn curve_layout(cols: &Cols, rows: &[usize], args: &Args) -> Layout {
    let mut lay = layout(cols, rows, args);
    let along = |c: &str| LOAD.contains(&c) || c == args.x;
    lay.series.retain(|c| !along(c));
    for c in SERVING {
        if !along(c) && lay.facet.as_deref() != Some(c) && varies(&cols[*c], rows) {
            lay.series.push(c.to_string());
        }
    }
    lay.group = LOAD.iter().map(|c| c.to_string()).collect();
    lay.lines = true;
    lay
}

/// A point's label: its offered load (`4/s`, `inf`, `≤8`: at most 8 in flight).
fn load_label(cols: &Cols, i: usize) -> String {
    let get = |c: &str| cols[c][i].clone();
    let rate = match (get("request_rate"), get("arrivals").as_deref()) {
        (Some(r), _) => Some(format!("{}/s", fields::trim_number(&r))),
        (None, Some("inf")) => Some("inf".into()),
        _ => None,
    };
    let cap = get("max_concurrency").map(|c| format!("≤{}", fields::trim_number(&c)));
    let parts: Vec<String> = rate.into_iter().chain(cap).collect();
    parts.join(" ")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.,
    }
}

/// The rows of each (panel, series, load): their (x, y) points.
type Points = BTreeMap<(usize, usize, Key), (String, Vec<f64>, Vec<RowPoint>)>;

/// The chart's data from the CSV and the flags; see the module docs.
pub fn build(df: &DataFrame, args: &Args) -> Result<Chart> {
    let value = metric_values(df, args)?;
    let xs = x_values(df, args)?;
    let rows: Vec<usize> = kept_rows(df, args, &value)?
        .into_iter()
        .filter(|&i| xs[i].is_some_and(f64::is_finite))
        .collect();
    if rows.is_empty() {
        return Err(Error::Config(format!(
            "--curve: no row has both {} and {}",
            args.x, args.metric
        )));
    }
    let cols = read_cols(df, args)?;
    let lay = curve_layout(&cols, &rows, args);
    let (rows, dropped) = match args.all_configs {
        true => (rows, 0),
        false => newest(&cols, rows, &lay),
    };
    let keys = series_keys(&cols, &rows, &lay);
    let facet = |i: usize| lay.facet.as_ref().and_then(|f| cols[f][i].clone());
    let mut facets: Vec<Option<String>> = vec![];
    for &i in &rows {
        if !facets.contains(&facet(i)) {
            facets.push(facet(i));
        }
    }
    let bounds = Bounds::read(df, &args.metric)?;
    let (_, scale) = fields::units(&args.metric);
    let mut points = Points::new();
    for &i in &rows {
        let p = facets.iter().position(|f| *f == facet(i)).unwrap_or(0);
        let s = keys.iter().position(|k| *k == key(&cols, &lay.series, i));
        let at = (p, s.unwrap_or(0), key(&cols, &lay.group, i));
        let e = points
            .entry(at)
            .or_insert((load_label(&cols, i), vec![], vec![]));
        e.1.push(xs[i].unwrap_or(f64::NAN));
        let v = value[i].unwrap_or(f64::NAN);
        e.2.push(bounds.row(i, v, scale));
    }
    let panels = (0..facets.len())
        .map(|p| panel(p, &facets[p], &points, &lay))
        .collect();
    let all_fused = fields::fused_union(rows.iter().filter_map(|&i| cols["fused"][i].as_deref()));
    Ok(Chart {
        panels,
        series: series_list(&keys, &lay, &all_fused),
        lines: true,
        curve: true,
        x_label: fields::units(&args.x).0,
        subtitle: subtitle(&cols, &rows, &lay),
        note: (dropped > 0).then(|| {
            format!(
                "each point: its engine's newest settings and build ({dropped} older runs not \
                 drawn; --all-configs draws every one)"
            )
        }),
        error_bars: None,
    })
}

/// Panel `p`: a group a point, sorted by x, so each series' line runs in x order.
fn panel(p: usize, facet: &Option<String>, points: &Points, lay: &Layout) -> Panel {
    let mut groups: Vec<Group> = points
        .iter()
        .filter(|((q, _, _), _)| *q == p)
        .map(|((_, s, _), (label, xs, ys))| Group {
            label: label.clone(),
            x: median(xs.clone()),
            points: vec![(*s, whiskers::fold(ys).0)],
            speedups: vec![],
        })
        .collect();
    groups.sort_by(|a, b| a.x.total_cmp(&b.x));
    let label = lay.facet.as_ref().zip(facet.as_deref());
    Panel {
        label: label.map(|(c, v)| fields::show(c, v, &[])),
        groups,
    }
}
