//! Columns derived from the other runs of the same call, defined once here. A call is the
//! directory (or `.tgz` archive) a log sits in: one host, one session, so runs are only set
//! against runs measured beside them.
//!
//! - `ratio_vs_hf_best` = throughput / throughput of the fastest finished HF run (engine
//!   `hf…`) of the same workload in the same call. Above 1 the run beats HF's best
//!   configuration there; HF's own runs read ≤ 1 (1 for the fastest).
//! - `ratio_vs_1gpu` (runs on tp × dp > 1 GPUs) = throughput / throughput of the fastest
//!   finished one-GPU run (tp 1, dp 1) of the same engine and workload in the same call
//!   (the same batch a rank, dropout and accumulation for dp).
//! - `scaling_efficiency` = `ratio_vs_1gpu` / (tp × dp).
//!
//! Throughput ([`throughput`]) is decode tokens/s for the generation suite, train samples/s
//! for training and samples/s otherwise. The workload is the columns of [`WORKLOAD`].

use crate::report::row::{is_hf, RunRow};
use std::collections::HashMap;
use std::path::Path;

/// The derived columns, recomputed on every read (a CSV's own are replaced).
pub const DERIVED: &[&str] = &["ratio_vs_hf_best", "ratio_vs_1gpu", "scaling_efficiency"];

/// What makes two runs the same work: rows that differ in one are never compared.
const WORKLOAD: &[&str] = &[
    "suite",
    "mode",
    "model",
    "dtype",
    "gpu",
    "gen_source",
    "dropout",
    "batch_size",
    "seq_len",
    "prompt_len",
    "new_tokens",
    "n_samples",
    "grad_accum",
];

/// The parallel layout: part of the workload against HF, what varies against one GPU.
const LAYOUT: &[&str] = &["tp", "dp", "zero"];

/// An engine's own configuration, which a one-GPU baseline shares (the `--fused` set does
/// not: a parallel run switches levers one GPU has no use for).
const ENGINE: &[&str] = &["engine", "attn", "hf_compile", "backward", "recompute"];

/// The throughput a ratio compares: the first of these a run has.
pub fn throughput(r: &RunRow) -> Option<f64> {
    [
        "decode_tokens_per_second",
        "train_samples_per_second",
        "samples_per_second",
    ]
    .iter()
    .find_map(|k| r.num(k))
    .filter(|t| *t > 0.)
}

/// The call a run was measured in: its archive, or its log's directory.
fn call(r: &RunRow) -> Option<String> {
    let file = r.meta.get("file")?;
    match file.split_once('!') {
        Some((archive, _)) => Some(archive.to_string()),
        None => Path::new(file).parent().map(|p| p.display().to_string()),
    }
}

fn finished(r: &RunRow) -> bool {
    r.meta.get("status").is_none_or(|s| s == "ok")
}

fn gpus(r: &RunRow) -> f64 {
    r.num("tp").unwrap_or(1.) * r.num("dp").unwrap_or(1.)
}

type Key = Vec<Option<String>>;

fn key(r: &RunRow, groups: &[&[&str]]) -> Option<Key> {
    let mut k = vec![Some(call(r)?)];
    k.extend(groups.iter().flat_map(|g| g.iter()).map(|c| r.cell(c)));
    Some(k)
}

/// The fastest throughput of the rows `keep` selects, by their key.
fn fastest(
    rows: &[RunRow],
    keep: impl Fn(&RunRow) -> bool,
    groups: &[&[&str]],
) -> HashMap<Key, f64> {
    let mut best: HashMap<Key, f64> = HashMap::new();
    for r in rows.iter().filter(|r| finished(r) && keep(r)) {
        if let (Some(k), Some(t)) = (key(r, groups), throughput(r)) {
            let b = best.entry(k).or_insert(t);
            *b = b.max(t);
        }
    }
    best
}

/// Sets the derived columns of every row (removing stale ones first).
pub fn add(rows: &mut [RunRow]) {
    for r in rows.iter_mut() {
        for d in DERIVED {
            r.metrics.remove(*d);
        }
    }
    let vs_hf: &[&[&str]] = &[WORKLOAD, LAYOUT];
    let vs_one: &[&[&str]] = &[WORKLOAD, ENGINE];
    let hf_best = fastest(
        rows,
        |r| r.meta.get("engine").is_some_and(|e| is_hf(e)),
        vs_hf,
    );
    let one_gpu = fastest(rows, |r| gpus(r) == 1., vs_one);
    for r in rows.iter_mut().filter(|r| finished(r)) {
        let Some(t) = throughput(r) else { continue };
        if let Some(b) = key(r, vs_hf).and_then(|k| hf_best.get(&k)) {
            r.set("ratio_vs_hf_best", t / b);
        }
        let n = gpus(r);
        if n > 1. {
            if let Some(b) = key(r, vs_one).and_then(|k| one_gpu.get(&k)) {
                r.set("ratio_vs_1gpu", t / b);
                r.set("scaling_efficiency", t / b / n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::row::Num;

    fn run(file: &str, engine: &str, tp: i64, dp: i64, samples_per_second: f64) -> RunRow {
        let mut r = RunRow {
            meta: Default::default(),
            metrics: Default::default(),
        };
        for (k, v) in [("file", file), ("engine", engine), ("model", "gpt2")] {
            r.meta.insert(k.into(), v.into());
        }
        r.meta.insert("status".into(), "ok".into());
        r.set("tp", Num::Int(tp));
        r.set("dp", Num::Int(dp));
        r.set("batch_size", Num::Int(16));
        r.set("samples_per_second", samples_per_second);
        r
    }

    #[test]
    fn ratios_pair_runs_of_one_call_only() {
        let mut rows = vec![
            run("a/c.jsonl", "candle", 1, 1, 300.),
            run("a/h.jsonl", "hf", 1, 1, 100.),
            run("a/hc.jsonl", "hf-compile", 1, 1, 150.),
            run("a/c2.jsonl", "candle", 2, 1, 450.),
            // Another call: no HF there, and its one-GPU run is not a's.
            run("b.tgz!logs/c.jsonl", "candle", 2, 1, 500.),
        ];
        rows[0].set("ratio_vs_1gpu", 9.); // a stale value is removed
        add(&mut rows);
        let get = |i: usize, k: &str| rows[i].num(k);
        assert_eq!(get(0, "ratio_vs_hf_best"), Some(2.));
        assert_eq!(get(1, "ratio_vs_hf_best"), Some(100. / 150.));
        assert_eq!(get(2, "ratio_vs_hf_best"), Some(1.));
        assert_eq!(get(0, "ratio_vs_1gpu"), None);
        assert_eq!(get(3, "ratio_vs_1gpu"), Some(1.5));
        assert_eq!(get(3, "scaling_efficiency"), Some(0.75));
        // tp 2 is a workload of its own against HF: no tp 2 HF run here.
        assert_eq!(get(3, "ratio_vs_hf_best"), None);
        assert_eq!(
            (get(4, "ratio_vs_hf_best"), get(4, "ratio_vs_1gpu")),
            (None, None)
        );
    }

    #[test]
    fn unfinished_runs_get_no_ratio_and_are_no_baseline() {
        let mut rows = vec![
            run("a/c.jsonl", "candle", 1, 1, 300.),
            run("a/h.jsonl", "hf", 1, 1, 500.),
            run("a/h2.jsonl", "hf", 1, 1, 100.),
        ];
        rows[1].meta.insert("status".into(), "oom".into());
        add(&mut rows);
        assert_eq!(rows[0].num("ratio_vs_hf_best"), Some(3.));
        assert_eq!(rows[1].num("ratio_vs_hf_best"), None);
    }
}
