//! The serving suite on the HF engine (`--suite serving --engine hf|both`), with the stand-in
//! worker (`tests/fixtures/fake_hf_worker.py`, no torch): the Rust side of the worker's
//! `serve_mode` / `serve` ops. The stand-in replays the load on a made-up clock (start 0.5 ms
//! after arrival, token k at start + 2 + k ms, finish 0.25 ms after the last token), so every
//! latency of its records and summary is known here; candle's run of the same load gives the
//! schema and the load to match.

mod common;

use common::cli::{error_line, fake_worker, fixture};
use common::{bench, bench_logging_to, only_file, records, text};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A serving run of 8 requests (input 8, output 4 tokens) on the gpt2 fixture with the
/// stand-in worker, `engine`, `extra` flags and `env`: its output.
fn run(dir: &Path, engine: &str, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let model = fixture("gpt2-fixture");
    let mut c = bench_logging_to(dir);
    c.args(["--suite", "serving", "--engine", engine, "--hf-worker"])
        .arg(fake_worker())
        .arg("--model-dir")
        .arg(model)
        .args([
            "--num-requests",
            "8",
            "--input-len",
            "8",
            "--output-len",
            "4",
        ])
        .args(["--warmup", "1"])
        .args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The records of every log the run printed, in order.
fn logs(o: &std::process::Output) -> Vec<Vec<Value>> {
    assert!(o.status.success(), "{}", text(o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("log: "))
        .map(|l| records(&PathBuf::from(l)))
        .collect()
}

fn requests(recs: &[Value]) -> Vec<&Value> {
    recs.iter().filter(|r| r["record"] == "request").collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// Equal but for the rounding of the stand-in's sums (its times add to random arrivals).
fn near(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} vs {b}");
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

/// `--engine both`: candle, then the worker, on the same load, each by its continuous batching
/// (the default); the worker's records and summary have candle's schema, its header names
/// transformers' manager, and its latencies are the stand-in's clock put through the suite's
/// formulas.
#[test]
fn both_engines_serve_the_same_load_into_one_schema() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--request-rate", "1000", "--slo", "ttft_ms=3,tpot_ms=1"];
    let o = run(dir.path(), "both", &extra, &[]);
    let logs = logs(&o);
    assert_eq!(logs.len(), 2, "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(" decode steps (")
            && stdout.contains("8 requests, each joining the running batch"),
        "candle's decode steps, the worker's admissions: {stdout}"
    );
    let (candle, hf) = (&logs[0], &logs[1]);
    assert_eq!(
        (candle[0]["engine"].as_str(), hf[0]["engine"].as_str()),
        (Some("candle"), Some("hf"))
    );
    let batching = |h: &Value| h["serving"]["batching"].as_str().unwrap().to_string();
    assert!(batching(&candle[0]).starts_with("continuous: "));
    assert!(batching(&hf[0]).starts_with("continuous: transformers' ContinuousBatchingManager"));
    assert_eq!(
        hf[0]["engine_info"]["serving_batching"],
        "continuous (FakeForCausalLM in transformers fake)"
    );
    assert!(
        hf[0]["engine_info"]["attn_chosen_by"]
            .as_str()
            .unwrap()
            .ends_with("serving probes no configuration"),
        "--hf-attn best's default: no probe, said so"
    );
    assert_eq!(
        candle[0]["data"]["sha256"], hf[0]["data"]["sha256"],
        "the same prompts"
    );
    // The same load: request i scheduled at the same time with the same lengths.
    let load = |recs: &[Value]| {
        let mut l: Vec<(u64, f64, u64, u64)> = requests(recs)
            .iter()
            .map(|r| {
                let n = |k: &str| r[k].as_u64().unwrap();
                (
                    n("request"),
                    f(r, "scheduled_ms"),
                    n("input_len"),
                    n("output_len"),
                )
            })
            .collect();
        l.sort_by_key(|r| r.0);
        l
    };
    assert_eq!(load(candle), load(hf));
    assert_eq!(load(hf).len(), 8);
    let (cr, hr) = (requests(candle), requests(hf));
    assert_eq!(keys(cr[0]), keys(hr[0]), "one request schema");
    let (cs, hs) = (candle.last().unwrap(), hf.last().unwrap());
    assert_eq!(
        (cs["record"].as_str(), hs["record"].as_str()),
        (Some("serving_summary"), Some("serving_summary"))
    );
    assert_eq!(keys(cs), keys(hs), "one summary schema");
    stand_in_latencies(&hr, hs);
}

/// The stand-in's clock through the suite's formulas: the worker's records and summary.
fn stand_in_latencies(hr: &[&Value], hs: &Value) {
    for r in hr {
        assert_eq!(f(r, "arrival_ms"), f(r, "scheduled_ms"), "open loop: {r}");
        near(f(r, "start_ms"), f(r, "arrival_ms") + 0.5);
        near(f(r, "first_token_ms"), f(r, "start_ms") + 2.);
        assert_eq!(r["token_ms"].as_array().unwrap().len(), 4);
        near(f(r, "finish_ms"), f(r, "first_token_ms") + 3.25);
    }
    // TTFT 2.5 ms and TPOT 3.25 / 3 ms every request: all meet the TTFT limit, none the TPOT's.
    near(f(&hs["ttft_ms"], "p99"), 2.5);
    near(f(&hs["tpot_ms"], "mean"), 3.25 / 3.);
    near(f(&hs["itl_ms"], "p50"), 1.);
    near(f(&hs["queue_ms"], "mean"), 0.5);
    assert_eq!(
        (hs["n_requests"].as_u64(), hs["n_batches"].as_u64()),
        (Some(8), Some(8))
    );
    assert!(
        hs["batch_size_mean"].is_null(),
        "the manager's steps are not counted"
    );
    assert_eq!(hs["total_output_tokens"], 32);
    assert_eq!(hs["slo_met_requests"], 0);
    let last_finish = hr.iter().map(|r| f(r, "finish_ms")).fold(0., f64::max);
    assert_eq!(f(hs, "duration_seconds"), last_finish / 1e3);
    assert_eq!(f(hs, "requests_per_second"), 8. / (last_finish / 1e3));
    assert_eq!(hs["peak_memory_bytes"], 1234, "the worker's memory");
    assert_eq!(hs["status"], "ok");
}

/// The worker's static batching, named as candle's: its fallback for a model without
/// continuous batching, and `--batching static` (the worker told so, nothing probed).
#[test]
fn the_worker_s_static_batching_is_named_as_candle_s() {
    // (flags, the stand-in's environment, how engine_info's serving_batching begins)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 2] = [
        (
            &[],
            &[("FAKE_SERVING", "static")],
            "static (FakeForCausalLM",
        ),
        (
            &["--batching", "static"],
            &[(
                "FAKE_SDPA",
                "flash / memory-efficient / math: cuDNN attention off",
            )],
            "static (asked for (--batching static))",
        ),
    ];
    for (flags, env, said) in cases {
        let dir = tempfile::tempdir().unwrap();
        let o = run(
            dir.path(),
            "hf",
            &[&["--batch-size", "4"], flags].concat(),
            env,
        );
        let log = &logs(&o)[0];
        assert_eq!(
            log[0]["serving"]["batching"],
            "static: the arrived requests, then generate"
        );
        let info = log[0]["engine_info"]["serving_batching"].as_str().unwrap();
        assert!(info.starts_with(said), "{info}");
        let sdpa = &log[0]["engine_info"]["serving_sdpa"];
        match env.iter().find(|(k, _)| *k == "FAKE_SDPA") {
            Some((_, said)) => assert_eq!(sdpa, said, "the worker's SDPA backends, named"),
            None => assert!(sdpa.is_null(), "none named off CUDA: {sdpa}"),
        }
        let s = log.last().unwrap();
        assert_eq!(
            (s["n_batches"].as_u64(), f(s, "batch_size_mean")),
            (Some(2), 4.)
        );
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(stdout.contains("8 requests in 2 calls"), "{}", text(&o));
    }
}

/// `--max-concurrency`: the worker is told the cap and its arrivals keep it.
#[test]
fn a_closed_loop_reaches_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(dir.path(), "hf", &["--max-concurrency", "2"], &[]);
    let log = &logs(&o)[0];
    let reqs = requests(log);
    assert_eq!(reqs.len(), 8);
    assert!(
        reqs.iter()
            .any(|r| f(r, "arrival_ms") > f(r, "scheduled_ms")),
        "some held back"
    );
    for t in reqs.iter().map(|r| f(r, "arrival_ms")) {
        let in_flight = reqs
            .iter()
            .filter(|r| f(r, "arrival_ms") <= t && t < f(r, "finish_ms"))
            .count();
        assert!(in_flight <= 2, "{in_flight} in flight at {t}");
    }
}

/// A worker whose times break the rules is a one-line error naming the request; one that
/// fails mid-replay keeps the requests it served, and its log closes with their summary.
#[test]
fn a_bad_or_failed_replay_is_one_line_and_keeps_what_was_served() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(dir.path(), "hf", &[], &[("FAKE_SERVE_BAD", "1")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = error_line(&String::from_utf8_lossy(&o.stderr));
    assert!(
        err.contains("request 0: 3 tokens timed for an output of 4"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let o = run(dir.path(), "hf", &[], &[("FAKE_SERVE_FAIL", "1")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = error_line(&String::from_utf8_lossy(&o.stderr));
    assert!(err.contains("CUDA out of memory (fake)"), "{err}");
    let log = only_file(dir.path());
    let recs = records(&log);
    assert_eq!(requests(&recs).len(), 4, "the half served");
    let s = recs.last().unwrap();
    assert_eq!(
        (s["record"].as_str(), s["status"].as_str()),
        (Some("serving_summary"), Some("oom")),
        "an out-of-memory error is status oom"
    );
    assert_eq!(s["n_requests"], 4);
}

/// The flags the worker is handed: it refuses nothing the candle path takes.
#[test]
fn hf_serving_is_no_longer_refused() {
    let o = bench()
        .args([
            "--suite",
            "serving",
            "--engine",
            "hf",
            "--python",
            "/nonexistent/python",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("does not run serving"), "{err}");
    assert!(err.contains("cannot start Python"), "{err}");
}

/// The real worker's `serve_mode` and `serve` (src/engines/hf/worker.py) under stand-in
/// `torch` / `transformers` modules: a manager stepping on a thread (continuous), a model
/// without the attention interface (static, queue.rs's queue), a manager that dies (the
/// fallback), `--batching static` (no probe), a transformers without the batch cap; each reply checked as the Rust side reads
/// it (tests/fixtures/worker_serving_check.py).
#[test]
fn the_worker_s_serving_ops_replay_a_load_under_stand_in_modules() {
    let o = std::process::Command::new("python3")
        .arg(fixture("worker_serving_check.py"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engines/hf/worker.py"))
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok 9 checks");
}
