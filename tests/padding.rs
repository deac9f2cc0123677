//! `--pad-multiple`: padding every batch to a multiple of N positions changes the shapes the
//! engines see, never the results. On the CPU tiny models and the shipped LAMBADA sample, with
//! and without `--pad-multiple 64`: the same log-likelihoods and argmax hits (scoring), the
//! same generated ids (`--mode generate`); and the logs say how far each batch was padded.

mod common;

use common::{bench, bench_logging_to, records, text};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn log_path(stdout: &[u8]) -> PathBuf {
    let out = String::from_utf8_lossy(stdout);
    let line = out.lines().find_map(|l| l.strip_prefix("log: "));
    PathBuf::from(line.expect("log path printed"))
}

/// The records of one run of `args` (plus `--limit 48 --batch-size 16`) logged under `dir`.
fn run(dir: &Path, args: &[&str]) -> Vec<Value> {
    let o = bench_logging_to(dir)
        .args(args)
        .args(["--limit", "48", "--batch-size", "16"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    records(&log_path(&o.stdout))
}

fn of_kind<'a>(recs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["record"] == kind).collect()
}

/// Every passage of a log's batches by its index.
fn passages(recs: &[Value], kind: &str) -> BTreeMap<u64, Value> {
    of_kind(recs, kind)
        .iter()
        .flat_map(|b| b["passages"].as_array().unwrap().clone())
        .map(|p| (p["index"].as_u64().unwrap(), p))
        .collect()
}

#[test]
fn scores_do_not_depend_on_the_padding() {
    for model in ["gpt2-tiny", "bloom-tiny"] {
        let dir = tempfile::tempdir().unwrap();
        let plain = run(dir.path(), &["--model", model]);
        let padded = run(dir.path(), &["--model", model, "--pad-multiple", "64"]);
        assert_eq!(plain[0]["pad_multiple"], 1, "{model}");
        assert_eq!(padded[0]["pad_multiple"], 64, "{model}");
        for b in of_kind(&padded, "batch") {
            assert_eq!(b["padded_len"].as_u64().unwrap() % 64, 0, "{model}: {b}");
        }
        let (a, b) = (passages(&plain, "batch"), passages(&padded, "batch"));
        assert_eq!(a.len(), 48);
        for (i, p) in &a {
            let q = &b[i];
            assert_eq!(p["greedy"], q["greedy"], "{model} passage {i}");
            let (x, y) = (p["ll"].as_f64().unwrap(), q["ll"].as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-5 * x.abs().max(1.),
                "{model} passage {i}: ll {x} vs {y} padded"
            );
        }
    }
}

#[test]
fn generated_ids_do_not_depend_on_the_padding() {
    for model in ["gpt2-tiny", "bloom-tiny"] {
        let dir = tempfile::tempdir().unwrap();
        let gen = ["--model", model, "--mode", "generate"];
        let plain = run(dir.path(), &gen);
        let padded = run(dir.path(), &[&gen[..], &["--pad-multiple", "64"]].concat());
        for c in of_kind(&padded, "gen_batch") {
            let (real, padded_len) = (c["prompt_len"].as_u64().unwrap(), c["padded_len"].as_u64());
            assert_eq!(padded_len, Some(real.div_ceil(64) * 64), "{model}: {c}");
        }
        let (a, b) = (
            passages(&plain, "gen_batch"),
            passages(&padded, "gen_batch"),
        );
        assert_eq!(a.len(), 48);
        for (i, p) in &a {
            assert_eq!(p["generated"], b[i]["generated"], "{model} passage {i}");
        }
    }
}

#[test]
fn with_a_multiple_the_warm_up_covers_every_padded_length() {
    let dir = tempfile::tempdir().unwrap();
    let recs = run(dir.path(), &["--pad-multiple", "8", "--warmup", "1"]);
    let lens: Vec<u64> = of_kind(&recs, "batch")
        .iter()
        .map(|b| b["padded_len"].as_u64().unwrap())
        .collect();
    let mut distinct = lens.clone();
    distinct.dedup();
    distinct.sort();
    distinct.dedup();
    // One warm-up batch asked for; one more for each other padded length.
    assert_eq!(
        recs[0]["warmup_batches"].as_u64().unwrap(),
        distinct.len() as u64,
        "{lens:?}"
    );
}

#[test]
fn a_bad_multiple_is_a_one_line_error() {
    for (args, want) in [
        (
            &["--pad-multiple", "0"][..],
            "--pad-multiple must be at least 1",
        ),
        (
            &["--suite", "wikitext2", "--pad-multiple", "8"][..],
            "--pad-multiple is for LAMBADA and generation",
        ),
    ] {
        let o = bench().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("Error: ") && err.contains(want), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[test]
fn help_says_hf_compile_pads_to_64() {
    let o = bench().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout).replace('\n', " ");
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("--pad-multiple <N>"), "{help}");
    assert!(help.contains("64 with --hf-compile"), "{help}");
    assert!(help.contains("[default: best]"), "{help}");
}
