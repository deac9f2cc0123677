//! Generation as a user runs it: `--mode generate` (LAMBADA the FasterTransformer way) and
//! `--suite generation`, their logs, the candle-vs-HF table, and one-line errors.

mod common;

use common::{bench_logging_to, records, text};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fake_worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_hf_worker.py")
}

fn log_paths(stdout: &[u8]) -> Vec<PathBuf> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("log: "))
        .map(PathBuf::from)
        .collect()
}

fn of_kind<'a>(recs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["record"] == kind).collect()
}

#[test]
fn lambada_generate_logs_every_call_and_the_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args(["--mode", "generate", "--limit", "10", "--batch-size", "4"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let recs = records(&log_paths(&o.stdout)[0]);
    let header = &recs[0];
    assert_eq!(header["generation"]["source"], "lambada");
    assert_eq!(header["generation"]["pad_id"], 50256);
    let calls = of_kind(&recs, "gen_batch");
    // 10 passages in calls of 4: 4, 4, 2; each call generates its longest target's length.
    let sizes: Vec<u64> = calls
        .iter()
        .map(|c| c["n_samples"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [4, 4, 2]);
    for c in &calls {
        let n = c["new_tokens"].as_u64().unwrap() as usize;
        for p in c["passages"].as_array().unwrap() {
            assert_eq!(p["generated"].as_array().unwrap().len(), n);
            // Random weights never pick the banned EOS (min_new_tokens semantics).
            assert!(!p["generated"]
                .as_array()
                .unwrap()
                .contains(&Value::from(50256)));
        }
    }
    let summary = recs.last().unwrap();
    assert_eq!(summary["record"], "summary");
    assert_eq!(summary["n_samples"], 10);
    assert!(summary["accuracy"].as_f64().unwrap() >= 0.);
    assert!(summary["generated_tokens_per_second"].as_f64().unwrap() > 0.);
    // LAMBADA times whole calls (as FasterTransformer): no per-token figures.
    assert!(summary.get("ttft_ms_p50").is_none());
}

#[test]
fn generation_suite_times_first_token_and_inter_token_latency() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args([
            "--suite",
            "generation",
            "--prompt-lens",
            "16",
            "--new-tokens",
            "5",
        ])
        .args(["--batch-size", "2", "--limit", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("inter-token ms"), "{out}");
    let recs = records(&log_paths(&o.stdout)[0]);
    let calls = of_kind(&recs, "gen_batch");
    assert_eq!(calls.len(), 3, "--limit 3 timed calls after the warm-up");
    for c in &calls {
        assert_eq!(c["prompt_len"], 16);
        assert_eq!(c["itl_ms"].as_array().unwrap().len(), 4);
        assert!(c["ttft_ms"].as_f64().unwrap() > 0.);
    }
    let s = recs.last().unwrap();
    assert!(s["decode_tokens_per_second"].as_f64().unwrap() > 0.);
    assert!(s["itl_ms_p99"].as_f64().unwrap() >= s["itl_ms_p50"].as_f64().unwrap());
    assert!(s["kv_cache_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn generation_lists_make_a_sweep_of_prompt_lengths_and_new_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args([
            "--suite",
            "generation",
            "--prompt-lens",
            "8,16",
            "--new-tokens",
            "2",
        ])
        .args(["--limit", "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("sweep: 2 runs (2 ok"), "{out}");
    assert!(out.contains("seq=16 new=2"), "{out}");
}

#[test]
fn engine_both_compares_generated_ids() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .env("BENCH_CACHE_DIR", dir.path().join("cache"))
        .args(["--mode", "generate", "--limit", "6", "--engine", "both"])
        .arg("--hf-worker")
        .arg(fake_worker())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("candle vs hf"), "{out}");
    assert!(out.contains("generated ids identical for"), "{out}");
    assert_eq!(log_paths(&o.stdout).len(), 2);
}

#[test]
fn acc_threshold_fails_a_run_below_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args([
            "--mode",
            "generate",
            "--limit",
            "4",
            "--acc-threshold",
            "0.5",
        ])
        .output()
        .unwrap();
    // Random weights get nothing right: below 0.5, exit 1, and it says so.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("below --acc-threshold 0.5"),
        "{}",
        text(&o)
    );
}

/// `bench ARGS` fails with one line naming the problem.
fn one_line_error(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path()).args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("Error: ") && err.contains(needle),
        "{args:?}: {err}"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "no log for bad input"
    );
}

#[test]
fn bad_generation_input_is_one_line() {
    one_line_error(
        &["--suite", "generation", "--new-tokens", "0"],
        "at least 1",
    );
    one_line_error(
        &[
            "--suite",
            "generation",
            "--prompt-lens",
            "1000",
            "--new-tokens",
            "100",
        ],
        "positions",
    );
    one_line_error(
        &["--suite", "wikitext2", "--mode", "generate"],
        "--mode generate",
    );
    one_line_error(&["--acc-threshold", "0.1"], "--acc-threshold");
    one_line_error(&["--new-tokens", "4"], "--suite generation");
}

/// Generated ids of every passage of a generation log, in file order.
fn generated(log: &Path) -> Vec<Value> {
    records(log)
        .iter()
        .filter(|r| r["record"] == "gen_batch")
        .flat_map(|r| r["passages"].as_array().unwrap().clone())
        .map(|p| p["generated"].clone())
        .collect()
}

#[test]
fn tensor_parallel_generation_generates_what_one_process_does() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--mode", "generate", "--limit", "6", "--batch-size", "3"];
    let one = bench_logging_to(&dir.path().join("tp1"))
        .args(args)
        .output()
        .unwrap();
    assert!(one.status.success(), "{}", text(&one));
    let two = bench_logging_to(&dir.path().join("tp2"))
        .args(args)
        .args(["--tp", "2"])
        .output()
        .unwrap();
    assert!(two.status.success(), "{}", text(&two));
    let logs = |d: &str| -> PathBuf {
        std::fs::read_dir(dir.path().join(d))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .unwrap()
    };
    // fp32 on CPU, the all-reduce summing in rank order: the same greedy choices.
    assert_eq!(generated(&logs("tp1")), generated(&logs("tp2")));
}

#[test]
fn extract_metrics_reads_the_generation_fields() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args([
            "--suite",
            "generation",
            "--prompt-lens",
            "8",
            "--new-tokens",
            "3",
        ])
        .args(["--limit", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let csv = dir.path().join("out.csv");
    let x = std::process::Command::new(env!("CARGO_BIN_EXE_extract-metrics"))
        .arg("-i")
        .arg(&log_paths(&o.stdout)[0])
        .arg("-o")
        .arg(&csv)
        .output()
        .unwrap();
    assert!(x.status.success(), "{}", text(&x));
    let text = std::fs::read_to_string(&csv).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    for col in [
        "generated_tokens_per_second",
        "decode_tokens_per_second",
        "ttft_ms_p50",
        "itl_ms_p99",
        "kv_cache_bytes",
        "new_tokens",
        "prompt_len",
        "gen_source",
    ] {
        assert!(header.contains(&col), "{col} missing from {header:?}");
    }
}
