//! The Tiny Shakespeare suite and the strategy sweep as users run them, on the CPU: the built-in
//! sample split as llm.c splits the corpus, time per epoch in the summary, bad input as one-line
//! errors, and `--strategies` laying dp and ZeRO-3 (each over two CPU ranks) with recompute off
//! and on side by side in one sweep, every configuration's log on disk.

mod common;
use common::{bench_logging_to as bench, records, text};

use serde_json::Value;
use std::path::{Path, PathBuf};

/// gpt2-tiny, small blocks, a few steps, dropout off.
const TRAIN: &[&str] = &[
    "--suite",
    "shakespeare",
    "--max-steps",
    "4",
    "--no-dropout",
    "--block-size",
    "32",
    "--batch-size",
    "2",
    "--warmup",
    "1",
];

/// Every `.jsonl` run log under `dir` (a sweep's folder included), sorted.
fn logs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(logs(&p));
        } else if p.extension().is_some_and(|x| x == "jsonl")
            && p.file_name().is_some_and(|n| n != "sweep.jsonl")
        {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn summary(recs: &[Value]) -> &Value {
    recs.iter()
        .find(|r| r["record"] == "train_summary")
        .unwrap()
}

#[test]
fn shakespeare_trains_on_llmc_split_and_reports_time_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench(dir.path()).args(TRAIN).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("time per epoch"), "{out}");
    let recs = records(&logs(dir.path())[0]);
    let header = &recs[0];
    assert_eq!(header["suite"], "shakespeare");
    assert_eq!(header["data"]["path"], "embedded:shakespeare_sample.txt");
    let train = &header["train"];
    assert!(train["note"].as_str().unwrap().contains("llm.c"), "{train}");
    // The sample's tokens: ~10 % evaluated, the rest trained, in blocks of 32.
    let (n_train, n_eval) = (
        train["n_train_blocks"].as_u64().unwrap(),
        train["n_eval_blocks"].as_u64().unwrap(),
    );
    assert!(
        n_eval > 0 && n_train > 8 * n_eval && n_train < 10 * n_eval,
        "{n_train} / {n_eval}"
    );
    let s = summary(&recs);
    let (steps_per_epoch, runtime) = (
        n_train.div_ceil(2) as f64,
        s["train_runtime"].as_f64().unwrap(),
    );
    let epoch = s["epoch_seconds"].as_f64().unwrap();
    assert!(
        (epoch - steps_per_epoch * runtime / 3.).abs() < 1e-9 * epoch,
        "{s}"
    );
    assert!(s["eval_loss"].as_f64().unwrap().is_finite());
    assert!(
        s.get("peak_memory_share").is_none(),
        "no GPU, no share: {s}"
    );
}

#[test]
fn shakespeare_bad_input_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.txt");
    let cases: [(Vec<&str>, &str); 4] = [
        (
            [TRAIN, &["--data", missing.to_str().unwrap()]].concat(),
            "Tiny Shakespeare",
        ),
        (
            [TRAIN, &["--eval-data", "x.txt"]].concat(),
            "--eval-data is for --suite wikitext2",
        ),
        (
            [TRAIN, &["--strategies", "dp,zero3"]].concat(),
            "give --dp N (N >= 2)",
        ),
        (
            vec!["--suite", "lambada", "--dp", "2", "--strategies", "dp"],
            "use it with --suite shakespeare",
        ),
    ];
    for (extra, msg) in cases {
        let o = bench(dir.path()).args(&extra).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{extra:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{extra:?}: {err}");
    }
}

/// Six configurations (dp and ZeRO-3, recompute off, on and mlp), each a child launching two
/// ranks; one table with a column each, and six logs naming their strategy. Every strategy
/// takes the same steps, so the losses agree across the columns.
#[test]
fn strategies_sweep_lays_dp_and_zero3_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench(dir.path())
        .args(TRAIN)
        .args([
            "--dp",
            "2",
            "--strategies",
            "dp,zero3",
            "--recompute",
            "off,on,mlp",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for label in [
        "candle dp",
        "candle dp+rc",
        "candle zero3",
        "candle zero3+rc",
        "candle dp+rc-mlp",
        "candle zero3+rc-mlp",
    ] {
        // A whole column name: `+rc` is a prefix of `+rc-mlp`.
        let column = [' ', '\n'].map(|end| format!("{label}{end}"));
        assert!(column.iter().any(|c| out.contains(c)), "{label}: {out}");
    }
    assert!(
        out.contains("time per epoch s") && out.contains("peak memory MiB"),
        "{out}"
    );
    let runs: Vec<Vec<Value>> = logs(dir.path()).iter().map(|p| records(p)).collect();
    assert_eq!(runs.len(), 6, "{out}");
    let mut seen: Vec<(u64, String)> = runs
        .iter()
        .map(|r| {
            let h = &r[0];
            (
                h["dp"]["zero_stage"].as_u64().unwrap(),
                h["engine_info"]["recompute"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let want = [
        (0, "blocks"),
        (0, "mlp"),
        (0, "off"),
        (3, "blocks"),
        (3, "mlp"),
        (3, "off"),
    ];
    assert_eq!(seen, want.map(|(z, r)| (z, r.to_string())));
    let losses: Vec<f64> = runs
        .iter()
        .map(|r| summary(r)["train_loss"].as_f64().unwrap())
        .collect();
    for l in &losses {
        assert!((l - losses[0]).abs() <= 1e-5 * losses[0], "{losses:?}");
    }
}
