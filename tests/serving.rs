//! The serving suite as a user runs it (`--suite serving`, issue #39), on the CPU with the
//! tiny random GPT-2, continuous and static batching: one record per request with its times
//! in order, a summary whose counts match, goodput against the SLO, the closed loop's cap, the
//! seed's schedule, two tensor-parallel ranks, one-line errors, and extract-metrics' row.
//! Behaviour only: no assertion on the machine's speed.

mod common;

use common::{bench, bench_logging_to, records, text};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A short serving run of 8 requests (input 8, output 4 tokens) into `dir`, plus `extra`
/// flags: its log's records.
fn serve(dir: &Path, extra: &[&str]) -> Vec<Value> {
    let fixed_input = ["--input-len", "8"];
    let input: &[&str] = match extra.contains(&"--input-len") {
        true => &[],
        false => &fixed_input,
    };
    let o = bench_logging_to(dir)
        .args([
            "--suite",
            "serving",
            "--num-requests",
            "8",
            "--output-len",
            "4",
        ])
        .args(["--warmup", "1"])
        .args(input)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let log: PathBuf = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("log: "))
        .expect("a log line")
        .into();
    records(&log)
}

fn requests(recs: &[Value]) -> Vec<&Value> {
    recs.iter().filter(|r| r["record"] == "request").collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn a_short_run_logs_every_request_in_order_and_a_matching_summary() {
    for batching in ["continuous", "static"] {
        let dir = tempfile::tempdir().unwrap();
        let args = ["--request-rate", "1000", "--batch-size", "4"];
        let recs = serve(dir.path(), &[&args[..], &["--batching", batching]].concat());
        short_run_checks(&recs, batching);
    }
}

/// What every batching's log holds: the header's load, one record per request with its times
/// in order, the summary's counts.
fn short_run_checks(recs: &[Value], batching: &str) {
    let header = &recs[0];
    assert_eq!(header["suite"], "serving");
    let info = &header["serving"];
    let said = info["batching"].as_str().unwrap();
    match batching {
        // Its first clause: a --tp run adds how the ranks share each operation.
        "static" => assert_eq!(
            said.split(';').next(),
            Some("static: the arrived requests, then generate")
        ),
        _ => assert!(said.starts_with("continuous: a slot KV cache"), "{said}"),
    }
    assert_eq!(
        (info["num_requests"].as_u64(), info["request_rate"].as_f64()),
        (Some(8), Some(1000.))
    );
    let reqs = requests(recs);
    assert_eq!(reqs.len(), 8, "one record per request");
    let mut seen: Vec<u64> = reqs
        .iter()
        .map(|r| r["request"].as_u64().unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, (0..8).collect::<Vec<u64>>());
    for r in &reqs {
        let t = |k| f(r, k);
        assert!(t("scheduled_ms") <= t("arrival_ms"), "{r}");
        assert!(t("arrival_ms") <= t("start_ms"), "{r}");
        assert!(t("start_ms") <= t("first_token_ms"), "{r}");
        assert!(t("first_token_ms") <= t("finish_ms"), "{r}");
        let tokens: Vec<f64> = r["token_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(tokens.len(), 4);
        assert_eq!(tokens[0], t("first_token_ms"));
        assert!(tokens.windows(2).all(|w| w[0] <= w[1]));
        assert!(*tokens.last().unwrap() <= t("finish_ms"));
        assert_eq!(
            (r["input_len"].as_u64(), r["output_len"].as_u64()),
            (Some(8), Some(4))
        );
        assert!(r["batch_size"].as_u64().unwrap() <= 4);
    }
    summary_checks(&reqs, recs.last().unwrap(), batching);
}

/// The short run's summary against its requests.
fn summary_checks(reqs: &[&Value], s: &Value, batching: &str) {
    assert_eq!(s["record"], "serving_summary");
    assert_eq!(s["status"], "ok");
    assert_eq!(s["n_requests"], 8);
    assert_eq!(
        (
            s["total_input_tokens"].as_u64(),
            s["total_output_tokens"].as_u64()
        ),
        (Some(64), Some(32))
    );
    let batches: std::collections::BTreeSet<u64> =
        reqs.iter().map(|r| r["batch"].as_u64().unwrap()).collect();
    let n_batches = s["n_batches"].as_u64().unwrap();
    if batching == "static" {
        assert_eq!(n_batches as usize, batches.len());
    } else {
        // n_batches counts decode steps: each request's 3 after its prefill, ≤ 4 slots a step.
        assert!((6..=24).contains(&n_batches), "{s}");
        assert!(batches.iter().all(|&b| b < n_batches), "{batches:?}");
        let rows = f(s, "batch_size_mean");
        assert!((1. ..=4.).contains(&rows), "{s}");
        assert!(
            reqs.iter()
                .all(|r| f(r, "finish_ms") == *r["token_ms"].as_array().unwrap().last().unwrap()),
            "a request leaves at its last token"
        );
    }
    let last_finish = reqs.iter().map(|r| f(r, "finish_ms")).fold(0., f64::max);
    // serde_json reads floats back to within an ulp or so, not always exactly.
    let close = |a: f64, b: f64| (a / b - 1.).abs() < 1e-12;
    assert!(close(f(s, "duration_seconds"), last_finish / 1e3), "{s}");
    let rate = 8. / f(s, "duration_seconds");
    assert!(close(f(s, "requests_per_second"), rate), "{s}");
    for k in ["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"] {
        let p = &s[k];
        assert!(
            f(p, "p50") <= f(p, "p90") && f(p, "p90") <= f(p, "p99"),
            "{k}: {p}"
        );
    }
    assert!(
        s.get("goodput_requests_per_second").is_none(),
        "no --slo, no goodput"
    );
}

/// `--tp 2` on two CPU ranks (rank 0 schedules, rank 1 performs each operation it sends): one
/// log, rank 0's, with every request and the summary, its header naming the ranks and the
/// broadcast, the load of the one-process run. The tokens the ranks make are compared with one
/// process's in src/scenarios/serving/tp_tests.rs (the log holds times, not ids).
#[test]
fn tp_ranks_serve_the_load_of_one_process_and_rank_0_logs_it() {
    for batching in ["continuous", "static"] {
        let args = [
            "--device",
            "cpu",
            "--request-rate",
            "1000",
            "--batch-size",
            "4",
        ];
        let args = [&args[..], &["--batching", batching]].concat();
        let one = tempfile::tempdir().unwrap();
        let want = serve(one.path(), &args);
        let dir = tempfile::tempdir().unwrap();
        let recs = serve(dir.path(), &[&args[..], &["--tp", "2"]].concat());
        let log = common::only_file(dir.path());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "rank 0 logs alone"
        );
        assert!(log.to_string_lossy().contains("_tp2_"), "{log:?}");
        short_run_checks(&recs, batching);
        let h = &recs[0];
        assert_eq!(h["tp"]["size"], 2);
        assert_eq!(h["tp"]["ranks"].as_array().map(Vec::len), Some(2));
        let said = h["serving"]["batching"].as_str().unwrap();
        let alone = want[0]["serving"]["batching"].as_str().unwrap();
        assert!(said.starts_with(alone), "{said}");
        assert!(said.contains("rank 0 schedules"), "{said}");
        assert_eq!(
            h["data"]["sha256"], want[0]["data"]["sha256"],
            "the same prompts"
        );
        let load = |recs: &[Value]| {
            let mut v: Vec<(u64, u64, u64)> = requests(recs)
                .iter()
                .map(|r| {
                    let n = |k: &str| r[k].as_u64().unwrap();
                    (n("request"), n("input_len"), n("output_len"))
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(load(&recs), load(&want), "{batching}");
        let tokens = |recs: &[Value]| recs.last().unwrap()["total_output_tokens"].clone();
        assert_eq!(tokens(&recs), tokens(&want));
    }
}

#[test]
fn goodput_is_zero_under_an_impossible_slo_and_the_throughput_under_a_loose_one() {
    let dir = tempfile::tempdir().unwrap();
    let strict = serve(
        dir.path(),
        &["--request-rate", "inf", "--slo", "ttft_ms=0,tpot_ms=0"],
    );
    let s = strict.last().unwrap();
    assert_eq!(
        (
            f(s, "goodput_requests_per_second"),
            s["slo_met_requests"].as_u64()
        ),
        (0., Some(0))
    );
    let loose = serve(
        dir.path(),
        &["--request-rate", "inf", "--slo", "ttft_ms=1e9,tpot_ms=1e9"],
    );
    let s = loose.last().unwrap();
    assert_eq!(
        f(s, "goodput_requests_per_second"),
        f(s, "requests_per_second")
    );
    assert_eq!(s["slo_met_requests"], 8);
}

#[test]
fn a_closed_loop_keeps_at_most_its_concurrency_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let recs = serve(dir.path(), &["--max-concurrency", "3", "--batch-size", "8"]);
    assert!(
        recs[0]["serving"]["request_rate"].is_null(),
        "closed loop: no rate"
    );
    let reqs = requests(&recs);
    assert_eq!(reqs.len(), 8);
    for t in reqs.iter().map(|r| f(r, "arrival_ms")) {
        let in_flight = reqs
            .iter()
            .filter(|r| f(r, "arrival_ms") <= t && t < f(r, "finish_ms"))
            .count();
        assert!(in_flight <= 3, "{in_flight} in flight at {t}");
    }
    assert!(reqs.iter().all(|r| r["batch_size"].as_u64().unwrap() <= 3));
}

#[test]
fn the_seed_fixes_arrivals_lengths_and_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let load = |seed: &str| {
        let recs = serve(
            dir.path(),
            &[
                "--request-rate",
                "50",
                "--input-len",
                "4:16",
                "--seed",
                seed,
            ],
        );
        let mut reqs: Vec<(u64, f64, u64)> = requests(&recs)
            .iter()
            .map(|r| {
                (
                    r["request"].as_u64().unwrap(),
                    f(r, "scheduled_ms"),
                    r["input_len"].as_u64().unwrap(),
                )
            })
            .collect();
        reqs.sort_by_key(|r| r.0);
        (reqs, recs[0]["data"]["sha256"].clone())
    };
    let (a, b, c) = (load("3"), load("3"), load("4"));
    assert_eq!(a, b, "same seed, same schedule and prompts");
    assert_ne!(a.0, c.0);
    assert_ne!(a.1, c.1);
}

#[test]
fn bad_serving_flags_are_one_line_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--suite", "serving", "--slo", "ttft=200"],
            "expected ttft_ms=X,tpot_ms=Y",
        ),
        (
            &["--suite", "serving", "--slo", "ttft_ms=fast"],
            "expected ttft_ms=X,tpot_ms=Y",
        ),
        (
            &["--suite", "serving", "--input-len", "9:3"],
            "expected N or A:B",
        ),
        (
            &["--suite", "serving", "--engine", "llmc"],
            "--engine llmc trains",
        ),
        (
            &["--suite", "serving", "--max-concurrency", "0"],
            "--max-concurrency must be at least 1",
        ),
        (&["--suite", "serving", "--limit", "4"], "--num-requests"),
        (&["--request-rate", "4"], "applies to --suite serving"),
        (
            &["--suite", "serving", "--batching", "dynamic"],
            "--batching 'dynamic': give continuous or static",
        ),
        (&["--batching", "static"], "applies to --suite serving"),
        (
            &["--suite", "serving", "--dp", "2"],
            "--dp is not supported for --suite serving",
        ),
        (
            &["--suite", "serving", "--tp", "2", "--engine", "hf"],
            "the candle engine only",
        ),
    ];
    for (args, want) in cases {
        let o = bench().args(*args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("Error: ") && err.contains(want),
            "{args:?}: {err}"
        );
    }
}

#[cfg(feature = "report")]
#[test]
fn extract_metrics_gives_a_serving_run_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let recs = serve(
        dir.path(),
        &["--request-rate", "200", "--slo", "ttft_ms=1e9,tpot_ms=1e9"],
    );
    let out = dir.path().join("out.csv");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_extract-metrics"))
        .args([
            "-i",
            dir.path().to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "one row per serving run: {csv}");
    let row: std::collections::HashMap<String, String> = common::extract::quoted_cells(lines[0])
        .into_iter()
        .zip(common::extract::quoted_cells(lines[1]))
        .collect();
    let fixed = [
        ("suite", "serving"),
        ("engine", "candle"),
        ("status", "ok"),
        ("arrivals", "poisson"),
        ("num_requests", "8"),
        ("n_requests", "8"),
        ("input_len_min", "8"),
        ("output_len_max", "4"),
        ("total_output_tokens", "32"),
        ("slo_met_requests", "8"),
        ("batch_size", "8"),
        ("batching_mode", "continuous"),
    ];
    for (col, want) in fixed {
        assert_eq!(
            row.get(col).map(String::as_str),
            Some(want),
            "{col} in {csv}"
        );
    }
    let batching = row.get("batching").map_or("", String::as_str);
    assert!(
        batching.starts_with("continuous: "),
        "the default: {batching}"
    );
    let s = recs.last().unwrap();
    let num = |col: &str| -> f64 {
        row[col]
            .parse()
            .unwrap_or_else(|_| panic!("{col}: {}", row[col]))
    };
    assert_eq!(num("request_rate"), 200.);
    for (col, got) in [
        ("requests_per_second", f(s, "requests_per_second")),
        ("output_tokens_per_second", f(s, "output_tokens_per_second")),
        (
            "goodput_requests_per_second",
            f(s, "goodput_requests_per_second"),
        ),
        ("ttft_ms_p50", f(&s["ttft_ms"], "p50")),
        ("ttft_ms_p99", f(&s["ttft_ms"], "p99")),
        ("tpot_ms_p90", f(&s["tpot_ms"], "p90")),
        ("e2e_ms_p99", f(&s["e2e_ms"], "p99")),
        ("itl_ms_p50", f(&s["itl_ms"], "p50")),
    ] {
        assert!(
            (num(col) / got - 1.).abs() < 1e-9,
            "{col}: {} vs {got}",
            row[col]
        );
    }
}
