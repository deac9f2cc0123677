//! CSV rows -> the chart's series: which rows are plotted (the filters) and which bar each
//! one joins. A series is named by model, engine (HF with its attention) and precision, plus
//! every other workload column whose value differs among the plotted rows, so one bar only
//! ever folds repeats of one configuration: their median, with a min..max range.

use super::{units, Args};
use crate::error::{Error, Result};
use crate::report::filter::Where;
use crate::report::row::{column_names, polars_err};
use polars::prelude::*;
use std::collections::BTreeMap;

/// One plotted value: median of the matching rows, with a min..max range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

/// series -> x -> point.
pub type Table = BTreeMap<String, BTreeMap<String, Point>>;

/// Columns that name a workload, as they join a series name when they vary: (column,
/// prefix). model, engine and dtype always name the series.
const DIMS: &[(&str, &str)] = &[
    ("suite", ""),
    ("batch_size", "bs"),
    ("seq_len", "seq "),
    ("gen_source", ""),
    ("prompt_len", "prompt "),
    ("new_tokens", "new "),
    ("hf_compile", "compile="),
    ("backward", "backward "),
    ("recompute", "recompute "),
    ("fused", "fused "),
    ("tp", "tp"),
    ("dp", "dp"),
    ("zero", "ZeRO-"),
    ("gpu", ""),
];

/// DIMS columns only one engine logs (candle's): left out of the other engines' names.
const ONE_ENGINE: &[&str] = &["backward", "recompute", "fused"];

fn text_column(df: &DataFrame, name: &str) -> Result<Vec<Option<String>>> {
    let Ok(c) = df.column(name) else {
        return Ok(vec![None; df.height()]);
    };
    let c = c.cast(&DataType::String).map_err(polars_err)?;
    Ok(c.str()
        .map_err(polars_err)?
        .iter()
        .map(|v| v.map(str::to_string))
        .collect())
}

fn number_column(df: &DataFrame, name: &str) -> Result<Option<Vec<Option<f64>>>> {
    let Ok(c) = df.column(name) else {
        return Ok(None);
    };
    let c = c.cast(&DataType::Float64).map_err(polars_err)?;
    Ok(Some(c.f64().map_err(polars_err)?.iter().collect()))
}

/// Indices of the rows that pass every filter.
fn kept_rows(df: &DataFrame, args: &Args) -> Result<Vec<usize>> {
    let n = df.height();
    let mut keep = vec![true; n];
    let mut retain = |col: Vec<Option<String>>, ok: &dyn Fn(Option<&str>) -> bool| {
        for (k, v) in keep.iter_mut().zip(&col) {
            *k &= ok(v.as_deref());
        }
    };
    let precisions = args.precisions();
    if !precisions.is_empty() {
        retain(text_column(df, "dtype")?, &|d| {
            d.is_some_and(|d| precisions.contains(&d))
        });
    }
    for (col, want) in [
        ("model", &args.model),
        ("suite", &args.suite),
        ("engine", &args.engine),
    ] {
        if let Some(w) = want {
            retain(text_column(df, col)?, &|v| v == Some(w.as_str()));
        }
    }
    if let Some(g) = &args.gpu {
        retain(text_column(df, "gpu")?, &|v| {
            v.is_some_and(|v| v.contains(g.as_str()))
        });
    }
    if let Some(b) = args.batch_size {
        retain(text_column(df, "batch_size")?, &|v| {
            v.and_then(|v| v.parse::<f64>().ok()) == Some(b)
        });
    }
    for w in Where::parse_all(&args.filters)? {
        if df.column(&w.key).is_err() {
            return Err(Error::Config(format!(
                "--where {}={}: no column '{}' (columns: {})",
                w.key,
                w.value,
                w.key,
                column_names(df)
            )));
        }
        retain(text_column(df, &w.key)?, &|v| w.matches(v));
    }
    Ok((0..n).filter(|i| keep[*i]).collect())
}

/// Each kept row's series name: model, engine (`hf-ATTN`), dtype, then every workload column
/// (but the x axis) whose value differs among the kept rows.
fn series_names(df: &DataFrame, rows: &[usize], x: &str) -> Result<Vec<String>> {
    let (model, engine, attn, dtype) = (
        text_column(df, "model")?,
        text_column(df, "engine")?,
        text_column(df, "attn")?,
        text_column(df, "dtype")?,
    );
    let mut dims = vec![];
    for (col, prefix) in DIMS.iter().filter(|(c, _)| *c != x) {
        let v = text_column(df, col)?;
        let first = &v[rows[0]];
        if rows.iter().any(|i| v[*i] != *first) {
            dims.push((v, *prefix, ONE_ENGINE.contains(col)));
        }
    }
    let names = rows
        .iter()
        .map(|&i| {
            let mut e = engine[i].clone().unwrap_or_else(|| "?".into());
            if let (Some(a), "hf") = (&attn[i], e.as_str()) {
                e = format!("hf-{a}");
            }
            let mut parts = vec![];
            if x != "model" {
                parts.extend(model[i].clone());
            }
            parts.push(e);
            if x != "dtype" {
                parts.extend(dtype[i].clone());
            }
            for (v, prefix, one_engine) in &dims {
                match (v[i].as_deref(), one_engine) {
                    (None, true) => {} // another engine's setting: nothing to say here
                    (v, _) => parts.push(format!("{prefix}{}", v.unwrap_or("-"))),
                }
            }
            parts.join(" ")
        })
        .collect();
    Ok(names)
}

/// The x categories in order: numerically when they are all numbers, else as first seen.
fn order_xs(mut xs: Vec<String>) -> Vec<String> {
    if xs.iter().all(|x| x.parse::<f64>().is_ok()) {
        xs.sort_by(|a, b| {
            a.parse::<f64>()
                .unwrap()
                .total_cmp(&b.parse::<f64>().unwrap())
        });
    }
    xs
}

/// The chart's data: series -> x -> point, and the x categories in order.
pub fn build_series(df: &DataFrame, args: &Args) -> Result<(Table, Vec<String>)> {
    let Some(value) = number_column(df, &args.metric)? else {
        return Err(Error::Config(format!(
            "no column '{}' in {} (columns: {})",
            args.metric,
            args.input.display(),
            column_names(df)
        )));
    };
    if df.column(&args.x).is_err() {
        return Err(Error::Config(format!(
            "--x {}: no such column (columns: {})",
            args.x,
            column_names(df)
        )));
    }
    let rows: Vec<usize> = kept_rows(df, args)?
        .into_iter()
        .filter(|i| value[*i].is_some())
        .collect();
    if rows.is_empty() {
        return Err(Error::Config(format!(
            "no rows of {} match the filters",
            args.input.display()
        )));
    }
    let lo = number_column(df, &format!("{}_min", args.metric))?;
    let hi = number_column(df, &format!("{}_max", args.metric))?;
    let xs = text_column(df, &args.x)?;
    let names = series_names(df, &rows, &args.x)?;
    let (_, scale) = units(&args.metric);
    // (series, x) -> every matching row's point.
    let mut raw: BTreeMap<(String, String), Vec<Point>> = BTreeMap::new();
    let mut x_order: Vec<String> = vec![];
    for (&i, name) in rows.iter().zip(names) {
        let (Some(v), Some(x)) = (value[i], xs[i].clone()) else {
            continue;
        };
        if !x_order.contains(&x) {
            x_order.push(x.clone());
        }
        let bound = |c: &Option<Vec<Option<f64>>>| c.as_ref().and_then(|c| c[i]).unwrap_or(v);
        raw.entry((name, x)).or_default().push(Point {
            value: v * scale,
            lo: bound(&lo) * scale,
            hi: bound(&hi) * scale,
        });
    }
    let mut table = Table::new();
    for ((series, x), mut pts) in raw {
        pts.sort_by(|a, b| a.value.total_cmp(&b.value));
        let vals: Vec<f64> = pts.iter().map(|p| p.value).collect();
        let point = Point {
            value: crate::metrics::percentile(&vals, 50.),
            lo: pts.iter().map(|p| p.lo).fold(f64::INFINITY, f64::min),
            hi: pts.iter().map(|p| p.hi).fold(f64::NEG_INFINITY, f64::max),
        };
        table.entry(series).or_default().insert(x, point);
    }
    Ok((table, order_xs(x_order)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut a = vec!["plot"];
        a.extend_from_slice(extra);
        Args::parse_from(a)
    }

    /// Two models × two engines on two GPUs, one run repeated, one at another batch size.
    fn frame() -> DataFrame {
        df!(
            "engine" => ["candle", "candle", "hf", "candle", "hf", "candle", "candle"],
            "model" => ["gpt2", "gpt2", "gpt2", "bloom", "bloom", "gpt2", "gpt2"],
            "dtype" => ["bf16"; 7],
            "gpu" => ["H100", "H100", "H100", "H100", "H100", "H200", "H100"],
            "batch_size" => [16i64, 16, 16, 16, 16, 16, 1],
            "samples_per_second" => [10., 12., 5., 3., 2., 20., 1.],
        )
        .unwrap()
    }

    #[test]
    fn one_series_per_model_engine_precision_grouped_by_gpu() {
        let (table, xs) = build_series(&frame(), &args(&["--batch-size", "16"])).unwrap();
        let names: Vec<&str> = table.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "bloom candle bf16",
                "bloom hf bf16",
                "gpt2 candle bf16",
                "gpt2 hf bf16"
            ]
        );
        assert_eq!(xs, ["H100", "H200"]);
        // The two H100 repeats of gpt2 candle: their median, with their range.
        let p = table["gpt2 candle bf16"]["H100"];
        assert_eq!((p.value, p.lo, p.hi), (11., 10., 12.));
        assert_eq!(table["gpt2 candle bf16"]["H200"].value, 20.);
        assert!(!table["bloom candle bf16"].contains_key("H200"));
    }

    #[test]
    fn rows_that_differ_in_batch_size_are_never_one_bar() {
        let (table, _) = build_series(&frame(), &args(&["--where", "model=gpt2"])).unwrap();
        let names: Vec<&str> = table.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "gpt2 candle bf16 bs1",
                "gpt2 candle bf16 bs16",
                "gpt2 hf bf16 bs16"
            ]
        );
        assert_eq!(table["gpt2 candle bf16 bs1"]["H100"].value, 1.);
        // x = model: the model leaves the series name and names the groups.
        let (table, xs) = build_series(
            &frame(),
            &args(&[
                "--x",
                "model",
                "--where",
                "gpu=H100",
                "--where",
                "batch_size=16",
            ]),
        )
        .unwrap();
        assert_eq!(xs, ["gpt2", "bloom"]);
        assert_eq!(table.keys().collect::<Vec<_>>(), ["candle bf16", "hf bf16"]);
    }

    #[test]
    fn default_output_names_the_metric_and_precisions() {
        assert_eq!(
            args(&["--metric", "samples_per_second", "--fp32"]).output_path(),
            std::path::PathBuf::from("samples_per_second_fp32.png")
        );
        assert_eq!(
            args(&[]).output_path().to_str(),
            Some("samples_per_second.png")
        );
        assert_eq!(args(&["-o", "x.svg"]).output_path().to_str(), Some("x.svg"));
    }
}
