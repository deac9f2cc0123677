//! A rate sweep of the serving suite (`--request-rate 50,200,inf`, #39 item 4) on the CPU with
//! the tiny random GPT-2: one child and one log per rate, the sweep's table of rates,
//! `--resume` running only the rate that is missing, a sweep over `--tp 2` CPU ranks (each
//! rate's child launching its ranks), extract-metrics' row per rate, and one-line errors for a
//! bad list. Behaviour only: no assertion on the machine's speed.

mod common;

use common::{bench, bench_logging_to, records, text};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A sweep of 4 requests a rate (input 4..8, output 3 tokens) at `rates` into `dir`, plus
/// `extra`; its stdout.
fn sweep(dir: &Path, rates: &str, extra: &[&str]) -> String {
    let o = bench_logging_to(dir)
        .args(["--suite", "serving", "--num-requests", "4"])
        .args(["--input-len", "4:8", "--output-len", "3", "--warmup", "1"])
        .args(["--request-rate", rates])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The one sweep directory in `dir`.
fn sweep_dir(dir: &Path) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.remove(0)
}

/// Each run log's header rate (None: inf), sorted by rate, inf last.
fn logged_rates(dir: &Path) -> Vec<Option<f64>> {
    let mut rates: Vec<Option<f64>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .filter(|p| !p.ends_with("sweep.jsonl"))
        .map(|p| {
            let recs: Vec<Value> = records(&p);
            assert_eq!(recs.last().unwrap()["record"], "serving_summary", "{p:?}");
            assert_eq!(recs.last().unwrap()["status"], "ok");
            recs[0]["serving"]["request_rate"].as_f64()
        })
        .collect();
    rates.sort_by(|a, b| a.unwrap_or(f64::MAX).total_cmp(&b.unwrap_or(f64::MAX)));
    rates
}

/// The rows of the sweep's rate table (the lines after its `serving` head).
fn table_rates(stdout: &str) -> Vec<String> {
    let rows = stdout.lines().skip_while(|l| !l.starts_with("serving "));
    rows.skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// `--tp 2` with a list of rates: each rate's child launches its two ranks, rank 0 logs.
#[test]
fn a_rate_sweep_over_tp_ranks_logs_each_rate_from_rank_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = sweep(dir.path(), "200,inf", &["--device", "cpu", "--tp", "2"]);
    assert!(out.contains("sweep: 2 runs (2 ok"), "{out}");
    assert_eq!(table_rates(&out), ["200", "inf"], "{out}");
    let sd = sweep_dir(dir.path());
    assert_eq!(logged_rates(&sd), [Some(200.), None], "one log a rate");
    for log in std::fs::read_dir(&sd).unwrap().map(|e| e.unwrap().path()) {
        let name = log.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".jsonl") && name != "sweep.jsonl" {
            assert!(name.contains("_tp2_"), "{name}");
            assert_eq!(records(&log)[0]["tp"]["size"], 2, "{name}");
        }
    }
}

/// A `--tp` sweep's ranks are checked before any child starts: the same one-line errors as a
/// single run's, not one failed child a rate.
#[test]
fn a_tp_sweep_that_cannot_launch_its_ranks_is_a_one_line_error() {
    let cases: [(&[&str], &str); 3] = [
        (&["--tp", "2", "--engine", "both"], "the candle engine only"),
        (&["--tp", "8", "--model", "gpt2-tiny"], "use 1 to 4 ranks"),
        (&["--tp", "2", "--zero", "1"], "--zero is for --dp runs"),
    ];
    for (extra, want) in cases {
        let o = bench()
            .args(["--suite", "serving", "--device", "cpu"])
            .args(["--request-rate", "50,inf"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
}

#[test]
fn a_rate_sweep_runs_a_child_per_rate_and_resumes_the_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = sweep(dir.path(), "50,200,inf", &[]);
    assert!(out.contains("sweep: 3 runs (3 ok"), "{out}");
    assert_eq!(table_rates(&out), ["50", "200", "inf"], "{out}");
    let head = out.lines().find(|l| l.starts_with("serving ")).unwrap();
    for col in [
        "rate req/s",
        "req/s",
        "out tok/s",
        "TTFT p99 ms",
        "TPOT p99 ms",
    ] {
        assert!(head.contains(col), "{head}");
    }
    let sd = sweep_dir(dir.path());
    assert_eq!(logged_rates(&sd), [Some(50.), Some(200.), None]);
    // The sweep log names each configuration's rate.
    let runs: Vec<String> = records(&sd.join("sweep.jsonl"))
        .iter()
        .filter(|r| r["record"] == "sweep_run")
        .map(|r| r["config"]["request_rate"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(runs, ["50", "200", "inf"]);
    // --resume with one more rate runs that rate only.
    let out = sweep(dir.path(), "50,200,inf,100", &["--resume"]);
    assert!(
        out.contains("1 runs (1 ok") && out.contains("3 done earlier and skipped"),
        "{out}"
    );
    assert_eq!(table_rates(&out), ["100"], "{out}");
    assert_eq!(logged_rates(&sd), [Some(50.), Some(100.), Some(200.), None]);
}

#[cfg(feature = "report")]
#[test]
fn extract_metrics_gives_each_rate_its_row() {
    let dir = tempfile::tempdir().unwrap();
    sweep(dir.path(), "50,200,inf", &["--slo", "ttft_ms=1e9"]);
    let csv = dir.path().join("out.csv");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_extract-metrics"))
        .args(["-i", sweep_dir(dir.path()).to_str().unwrap()])
        .args(["-o", csv.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| head.iter().position(|c| *c == name).unwrap();
    let (rate, arrivals, goodput) = (
        col("request_rate"),
        col("arrivals"),
        col("goodput_requests_per_second"),
    );
    let mut got: Vec<(String, String)> = vec![];
    for line in lines {
        let cells = common::extract::quoted_cells(line);
        assert!(!cells[goodput].is_empty(), "goodput in {line}");
        got.push((cells[rate].clone(), cells[arrivals].clone()));
    }
    got.sort();
    let want = [("", "inf"), ("200.0", "poisson"), ("50.0", "poisson")];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want, "{text}");
}

#[test]
fn a_bad_rate_list_is_a_one_line_error() {
    let cases = [
        (
            "abc",
            "--request-rate 'abc': give requests/s above 0, or inf",
        ),
        ("", "--request-rate '': give requests/s above 0, or inf"),
        ("1,,2", "--request-rate '': give requests/s above 0, or inf"),
        ("4,0", "--request-rate '0': give requests/s above 0, or inf"),
        ("2,2", "2 is listed twice"),
    ];
    for (rates, want) in cases {
        let o = bench()
            .args(["--suite", "serving", "--request-rate", rates])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{rates:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{rates:?}: {err}");
        assert!(
            err.starts_with("Error: ") && err.contains(want),
            "{rates:?}: {err}"
        );
    }
}

#[test]
fn a_dead_serving_childs_log_is_closed_with_a_summary_of_its_requests() {
    use transformer_bench::launch::sweep::complete_log;
    use transformer_bench::record::RunStatus;
    let dir = tempfile::tempdir().unwrap();
    sweep(dir.path(), "200,inf", &["--slo", "ttft_ms=1e9"]);
    let sd = sweep_dir(dir.path());
    let log = std::fs::read_dir(&sd)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| !p.ends_with("sweep.jsonl"))
        .unwrap();
    // As if killed after its third request: the summary and the last request gone.
    let text = std::fs::read_to_string(&log).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .take_while(|l| !l.contains("\"serving_summary\""))
        .collect();
    let kept = &kept[..kept.len() - 1];
    std::fs::write(&log, kept.join("\n") + "\n").unwrap();
    let end = complete_log(&log, "killed by signal 9", Some(RunStatus::Killed))
        .unwrap()
        .expect("a summary");
    assert_eq!(end.status, RunStatus::Killed);
    let recs = records(&log);
    let s = recs.last().unwrap();
    assert_eq!(s["record"], "serving_summary");
    assert_eq!(
        (s["n_requests"].as_u64(), s["slo_met_requests"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(s["error"], "killed by signal 9");
}
