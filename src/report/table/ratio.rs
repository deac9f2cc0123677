//! `--ratio A/B`: two engines side by side. Every finished (`status` ok) run of engine B is
//! paired with each run of engine A from the same directory (one host, one session) with
//! the same model, suite, dtype, batch size, GPU, tp / dp / ZeRO, sequence length and
//! passage count. Ratios are A / B: samples/s above 1 and latency below 1 mean A is faster.
//!
//! Throughput is `samples_per_second` (inference) or `train_samples_per_second` (training),
//! latency `latency_ms_p50` or `step_latency_ms_p50`, memory `peak_memory_bytes`.

use super::{precision_rank, Col, Fmt};
use crate::error::{Error, Result};
use crate::record::RunStatus;
use crate::report::row::{polars_err, RunRow};
use polars::prelude::*;
use std::path::Path;

/// The two engines: A / B.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    pub a: String,
    pub b: String,
}

impl Pair {
    pub fn parse(spec: &str) -> Result<Self> {
        match spec.split_once('/') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('/') => Ok(Self {
                a: a.into(),
                b: b.into(),
            }),
            _ => Err(Error::Config(format!(
                "--ratio {spec}: expected two engines as A/B, e.g. --ratio candle/hf"
            ))),
        }
    }
}

/// Text columns that must match, then numeric ones (a missing value matches a missing one).
const TEXT_KEY: &[&str] = &["model", "suite", "dtype", "gpu"];
const NUM_KEY: &[&str] = &["batch_size", "tp", "dp", "zero", "seq_len", "n_samples"];

fn dir(r: &RunRow) -> Option<&Path> {
    r.meta.get("file").and_then(|f| Path::new(f).parent())
}

fn same_key(a: &RunRow, b: &RunRow) -> bool {
    dir(a) == dir(b)
        && TEXT_KEY.iter().all(|k| a.meta.get(*k) == b.meta.get(*k))
        && NUM_KEY.iter().all(|k| a.num(k) == b.num(k))
}

fn throughput(r: &RunRow) -> Option<f64> {
    r.num("samples_per_second")
        .or_else(|| r.num("train_samples_per_second"))
}

fn latency(r: &RunRow) -> Option<f64> {
    r.num("latency_ms_p50")
        .or_else(|| r.num("step_latency_ms_p50"))
}

/// B's configuration as a label: `hf-eager` for HF runs that name their attention,
/// `+compile` with torch.compile, ` (best)` when `--hf-attn best` chose the attention.
fn config(r: &RunRow, engine: &str) -> String {
    let meta = |k: &str| r.meta.get(k).map(String::as_str);
    let mut label = match meta("attn") {
        Some(a) => format!("{engine}-{a}"),
        None => engine.to_string(),
    };
    if meta("hf_compile") == Some("true") {
        label += "+compile";
    }
    if meta("attn_requested") == Some("best") {
        label += " (best)";
    }
    label
}

/// The (A, B) pairs, sorted by model, suite, precision, batch size (largest first), B's config.
fn pairs<'a>(rows: &'a [RunRow], p: &Pair) -> Vec<(&'a RunRow, &'a RunRow)> {
    let ok = |r: &RunRow, e: &str| {
        r.meta.get("engine").map(String::as_str) == Some(e)
            && r.meta.get("status").map(String::as_str) == Some(RunStatus::Ok.as_str())
    };
    let mut out = vec![];
    for b in rows.iter().filter(|r| ok(r, &p.b)) {
        for a in rows.iter().filter(|r| ok(r, &p.a) && same_key(r, b)) {
            out.push((a, b));
        }
    }
    let text = |r: &RunRow, k: &str| r.meta.get(k).cloned().unwrap_or_default();
    out.sort_by(|(_, x), (_, y)| {
        let key = |r: &RunRow| {
            (
                text(r, "model"),
                text(r, "suite"),
                precision_rank(&text(r, "dtype")),
            )
        };
        key(x)
            .cmp(&key(y))
            .then(
                y.num("batch_size")
                    .unwrap_or(0.)
                    .total_cmp(&x.num("batch_size").unwrap_or(0.)),
            )
            .then(config(x, &p.b).cmp(&config(y, &p.b)))
    });
    out
}

/// The ratio table and its Markdown columns. Key columns that are the same in every row
/// (suite, GPU, tp, dp, ZeRO, sequence length) are left out; model, dtype, batch size and
/// passages (where logged) stay.
pub fn ratio_table(rows: &[RunRow], p: &Pair) -> Result<(DataFrame, Vec<Col>)> {
    let pairs = pairs(rows, p);
    if pairs.is_empty() {
        let engines: std::collections::BTreeSet<&str> = rows
            .iter()
            .filter_map(|r| r.meta.get("engine").map(String::as_str))
            .collect();
        return Err(Error::Config(format!(
            "--ratio {}/{}: no finished '{}' run has a '{}' run in the same directory with the same model, suite, dtype, batch size, GPU, tp/dp and passages (engines here: {})",
            p.a, p.b, p.b, p.a,
            engines.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let (mut columns, mut cols) = (vec![], vec![]);
    key_columns(&pairs, &mut columns, &mut cols);
    let b_config: Vec<String> = pairs.iter().map(|(_, b)| config(b, &p.b)).collect();
    columns.push(Column::new(p.b.as_str().into(), b_config));
    cols.push(Col::new(&p.b, &p.b, Fmt::Auto));
    measure_columns(&pairs, p, &mut columns, &mut cols);
    let df = DataFrame::new(pairs.len(), columns).map_err(polars_err)?;
    Ok((df, cols))
}

/// The pairs' key columns: model, dtype, batch size and passages always (passages where
/// logged), the others where they differ between rows.
fn key_columns(pairs: &[(&RunRow, &RunRow)], columns: &mut Vec<Column>, cols: &mut Vec<Col>) {
    for k in TEXT_KEY {
        let v: Vec<Option<String>> = pairs.iter().map(|(_, b)| b.meta.get(*k).cloned()).collect();
        if matches!(*k, "model" | "dtype") || v.iter().any(|x| *x != v[0]) {
            columns.push(Column::new((*k).into(), v));
            cols.push(Col::new(k, k, Fmt::Auto));
        }
    }
    for (k, label) in [
        ("batch_size", "batch"),
        ("n_samples", "passages"),
        ("tp", "tp"),
        ("dp", "dp"),
        ("zero", "ZeRO"),
        ("seq_len", "seq_len"),
    ] {
        let v: Vec<Option<i64>> = pairs
            .iter()
            .map(|(_, b)| b.num(k).map(|x| x as i64))
            .collect();
        let keep = match k {
            "batch_size" => true,
            "n_samples" => v.iter().any(Option::is_some),
            _ => v.iter().any(|x| *x != v[0]),
        };
        if keep {
            columns.push(Column::new(k.into(), v));
            cols.push(Col::new(k, label, Fmt::Auto));
        }
    }
}

fn peak_memory(r: &RunRow) -> Option<f64> {
    r.num("peak_memory_bytes")
}

/// A's and B's throughput, latency and memory with their ratios (A / B), and the
/// perplexity's relative difference |A − B| / B.
fn measure_columns(
    pairs: &[(&RunRow, &RunRow)],
    p: &Pair,
    columns: &mut Vec<Column>,
    cols: &mut Vec<Col>,
) {
    type Measure = (&'static str, &'static str, fn(&RunRow) -> Option<f64>, Fmt);
    let measures: [(Measure, &str); 3] = [
        (
            ("samples_per_second", "samples/s", throughput, Fmt::Fixed(1)),
            "ratio",
        ),
        (
            ("latency_ms_p50", "p50 ms", latency, Fmt::Fixed(2)),
            "p50 ratio",
        ),
        (
            (
                "peak_memory_bytes",
                "peak MiB",
                peak_memory,
                Fmt::Bytes((1u64 << 20) as f64, 0),
            ),
            "mem ratio",
        ),
    ];
    for (i, ((name, label, f, fmt), ratio_label)) in measures.into_iter().enumerate() {
        let va: Vec<Option<f64>> = pairs.iter().map(|(a, _)| f(a)).collect();
        let vb: Vec<Option<f64>> = pairs.iter().map(|(_, b)| f(b)).collect();
        let r: Vec<Option<f64>> = va
            .iter()
            .zip(&vb)
            .map(|(x, y)| Some((*x)? / (*y)?))
            .collect();
        for (who, v) in [(&p.a, va), (&p.b, vb)] {
            let n = format!("{who}_{name}");
            // Bytes are integers.
            let column = if name.ends_with("_bytes") {
                let ints: Vec<Option<i64>> = v.iter().map(|x| x.map(|x| x as i64)).collect();
                Column::new(n.as_str().into(), ints)
            } else {
                Column::new(n.as_str().into(), v)
            };
            columns.push(column);
            cols.push(Col::new(&n, &format!("{who} {label}"), fmt));
        }
        let n = format!("{name}_ratio");
        columns.push(Column::new(n.as_str().into(), r));
        cols.push(if i == 0 {
            // The headline column.
            Col::new(&n, &format!("**{ratio_label}**"), Fmt::Fixed(2)).bold()
        } else {
            Col::new(&n, ratio_label, Fmt::Fixed(2))
        });
    }
    let ppl: Vec<Option<f64>> = pairs
        .iter()
        .map(|(a, b)| {
            let (pa, pb) = (a.num("perplexity")?, b.num("perplexity")?);
            Some((pa - pb).abs() / pb)
        })
        .collect();
    columns.push(Column::new("perplexity_rel_diff".into(), ppl));
    cols.push(Col::new(
        "perplexity_rel_diff",
        "ppl rel. diff",
        Fmt::Sci(1),
    ));
}
