//! Tensor parallelism as users run it (`bench --tp N`), on CPU ranks (TCP all-reduce): the
//! same scores as one process, one log from rank 0 that names every rank, ranks started by an
//! outside launcher, a rank killed mid-run, and the errors for what --tp does not do.

mod common;
use common::{bench_logging_to as bench, finished_records, records, text};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

fn logs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// (log-likelihood, greedy) of every passage in a log, by passage index.
fn passages(recs: &[Value]) -> Vec<(f64, bool)> {
    let mut v: Vec<(u64, f64, bool)> = recs
        .iter()
        .filter(|r| r["record"] == "batch")
        .flat_map(|r| r["passages"].as_array().unwrap().clone())
        .map(|p| {
            (
                p["index"].as_u64().unwrap(),
                p["ll"].as_f64().unwrap(),
                p["greedy"].as_bool().unwrap(),
            )
        })
        .collect();
    v.sort_by_key(|p| p.0);
    v.into_iter().map(|(_, ll, g)| (ll, g)).collect()
}

#[test]
fn tp_ranks_score_like_one_process_and_rank_0_logs_them_all() {
    for (model, n) in [("gpt2-tiny", "2"), ("bloom-tiny", "3")] {
        let one = tempfile::tempdir().unwrap();
        let o = bench(one.path()).args(["--model", model]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let tp = tempfile::tempdir().unwrap();
        let o = bench(tp.path())
            .args(["--model", model, "--tp", n])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.matches("accuracy").count(), 1, "one summary: {out}");
        assert!(
            out.contains(&format!("tensor parallel: {n} ranks over tcp")),
            "{out}"
        );

        let tp_logs = logs(tp.path());
        assert_eq!(tp_logs.len(), 1, "only rank 0 logs: {tp_logs:?}");
        assert!(tp_logs[0].to_string_lossy().contains(&format!("_tp{n}_")));
        let recs = records(&tp_logs[0]);
        let info = &recs[0]["tp"];
        assert_eq!(info["size"], n.parse::<u64>().unwrap());
        let ranks = info["ranks"].as_array().unwrap();
        let pids: std::collections::BTreeSet<u64> =
            ranks.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
        assert_eq!(pids.len(), ranks.len(), "one process a rank: {info}");
        assert_eq!(ranks[1]["rank"], 1);

        let want = passages(&records(&logs(one.path())[0]));
        let got = passages(&recs);
        assert_eq!(got.len(), 100);
        for (i, ((ll, greedy), (ll1, greedy1))) in got.iter().zip(&want).enumerate() {
            // Partial sums added in another order: fp32 rounding only.
            assert!(
                (ll - ll1).abs() <= 1e-5 * ll1.abs(),
                "{model} passage {i}: {ll} vs {ll1}"
            );
            assert_eq!(greedy, greedy1, "{model} passage {i}");
        }
    }
}

/// `--min-time`: each rank times its own batches, so rank 0 decides at each pass end and the
/// group follows (every forward all-reduces: a rank that stopped alone would hang the others).
#[test]
fn tp_ranks_run_the_passes_rank_0_decides() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench(dir.path())
        .args(["--tp", "2", "--limit", "20", "--batch-size", "8"])
        .args(["--min-time", "0.3", "--min-batches", "4"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let recs = records(&logs(dir.path())[0]);
    let s = recs.last().unwrap();
    let passes = s["passes"].as_u64().unwrap();
    assert!(passes >= 2, "4 batches of 3 a pass: {s}");
    assert_eq!(
        s["n_batches"].as_u64().unwrap(),
        3 * passes,
        "whole passes: {s}"
    );
    assert!(s["timed_seconds"].as_f64().unwrap() >= 0.3, "{s}");
    assert_eq!(passages(&recs).len(), 20, "passages of the first pass only");
}

/// A port P held open (as torchrun's agent holds MASTER_PORT with its store) whose next port
/// is free.
fn held_port_with_a_free_next() -> (std::net::TcpListener, u16) {
    loop {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return (held, port);
        }
    }
}

/// Under torchrun its agent's store listens on MASTER_PORT: the ranks meet on the next port.
#[test]
fn ranks_started_by_torchrun_variables_form_one_group() {
    let dir = tempfile::tempdir().unwrap();
    let (_torchrun_store, port) = held_port_with_a_free_next();
    let port = port.to_string();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            bench(dir.path())
                .args(["--tp", "2", "--limit", "20"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("TORCHELASTIC_RUN_ID", "none")
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    assert!(String::from_utf8_lossy(&outs[0].stdout).contains("accuracy"));
    assert!(outs[1].stdout.is_empty(), "rank 1 prints nothing");
    let recs = records(&logs(dir.path())[0]);
    assert_eq!(recs[0]["tp"]["launcher"], "Torchrun");
    assert_eq!(passages(&recs).len(), 20);
}

#[test]
fn a_rank_killed_mid_run_stops_the_group_and_rank_0_keeps_its_batches() {
    let dir = tempfile::tempdir().unwrap();
    // GPT-2 124M at batch 1: ~0.5 s a batch on CPU, time to kill rank 1 half-way.
    let mut launcher = bench(dir.path())
        .args([
            "--tp",
            "2",
            "--model",
            "gpt2",
            "--batch-size",
            "1",
            "--limit",
            "60",
        ])
        .spawn()
        .unwrap();
    let t = Instant::now();
    let (log, pid) = loop {
        assert!(t.elapsed() < Duration::from_secs(120), "no batches logged");
        std::thread::sleep(Duration::from_millis(100));
        let Some(log) = logs(dir.path()).pop() else {
            continue;
        };
        let recs = finished_records(&log);
        if recs.iter().filter(|r| r["record"] == "batch").count() >= 2 {
            break (log, recs[0]["tp"]["ranks"][1]["pid"].as_u64().unwrap());
        }
    };
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let o = launcher_output(&mut launcher);
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "{:?}",
        killed.elapsed()
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 1 was killed"), "{err}");
    let recs = finished_records(&log);
    assert_eq!(recs[0]["record"], "header");
    let batches = recs.iter().filter(|r| r["record"] == "batch").count();
    assert!((2..60).contains(&batches), "{batches} batches kept");
}

fn launcher_output(child: &mut std::process::Child) -> Output {
    let status = child.wait().unwrap();
    let mut stderr = vec![];
    std::io::Read::read_to_end(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    Output {
        status,
        stdout: vec![],
        stderr,
    }
}

#[test]
fn what_tp_does_not_do_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["--tp", "5"],
            "gpt2-tiny has 4 attention heads; use 1 to 4 ranks",
        ),
        (&["--tp", "2", "--engine", "hf"], "the candle engine only"),
        (&["--tp", "2", "--suite", "wikitext2"], "LAMBADA only"),
        (&["--tp", "2", "--dtype", "fp32,bf16"], "in a sweep"),
        (&["--tp", "0"], "--tp must be at least 1"),
        (
            &["--tp", "2", "--device", "cuda:1"],
            "pick GPUs with CUDA_VISIBLE_DEVICES",
        ),
    ];
    for (args, msg) in cases {
        let o = bench(dir.path()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(logs(dir.path()).is_empty());
}
