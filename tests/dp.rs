//! Data-parallel fine-tuning as users run it (`bench --suite wikitext2 --dp N`), on CPU ranks
//! (TCP all-reduce): dp=2 follows the loss curve of one process accumulating the same
//! micro-batches, at every ZeRO stage (ZeRO-3 with --recompute and --grad-accum too), rank 0
//! logs the group, and misuse is a one-line error.

mod common;
use common::{bench_logging_to as bench, records, text};

use serde_json::Value;
use std::path::{Path, PathBuf};

fn only_log(dir: &Path) -> PathBuf {
    let logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 1, "one log: {logs:?}");
    logs[0].clone()
}

/// (loss, grad_norm) of every step, and the summary.
fn curve(recs: &[Value]) -> (Vec<(f64, f64)>, Value) {
    let steps = recs
        .iter()
        .filter(|r| r["record"] == "step")
        .map(|r| {
            (
                r["loss"].as_f64().unwrap(),
                r["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect();
    let summary = recs
        .iter()
        .find(|r| r["record"] == "train_summary")
        .unwrap();
    (steps, summary.clone())
}

/// gpt2-tiny on the built-in sample, small blocks so it runs in seconds, dropout off (each
/// rank draws its own dropout masks).
const TRAIN: &[&str] = &[
    "--suite",
    "wikitext2",
    "--max-steps",
    "6",
    "--no-dropout",
    "--block-size",
    "64",
    "--batch-size",
    "2",
    "--warmup",
    "0",
    "--lr",
    "1e-3",
];

/// Steps' (loss, grad_norm), the summary, the header, and each step's sample count.
fn run(extra: &[&str]) -> (Vec<(f64, f64)>, Value, Value, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let o = bench(dir.path()).args(TRAIN).args(extra).output().unwrap();
    assert!(o.status.success(), "{extra:?}: {}", text(&o));
    let recs = records(&only_log(dir.path()));
    let (steps, summary) = curve(&recs);
    let samples = recs
        .iter()
        .filter(|r| r["record"] == "step")
        .map(|r| r["n_samples"].as_u64().unwrap())
        .collect();
    (steps, summary, recs[0].clone(), samples)
}

/// Every step of `two` has `one`'s loss within fp32 rounding (1e-6: the loss crosses ranks as
/// f32) and its gradient norm within `norm_tol`.
fn same_curve(two: &[(f64, f64)], one: &[(f64, f64)], norm_tol: f64, what: &str) {
    assert_eq!(two.len(), one.len(), "{what}");
    for (i, ((l2, g2), (l1, g1))) in two.iter().zip(one).enumerate() {
        assert!(
            (l2 - l1).abs() <= 1e-6 * l1.abs(),
            "{what} step {i}: loss {l2} vs {l1}"
        );
        assert!(
            (g2 - g1).abs() <= norm_tol * g1.abs(),
            "{what} step {i}: norm {g2} vs {g1}"
        );
    }
}

#[test]
fn dp2_follows_one_process_with_twice_the_accumulation() {
    let (one, one_sum, _, one_samples) = run(&["--grad-accum", "2"]);
    assert!(one_samples.iter().all(|&n| n == 4), "{one_samples:?}");
    assert_eq!(one.len(), 6);
    for (zero, overlap) in [
        ("0", false),
        ("1", false),
        ("0", true),
        ("2", false),
        ("3", false),
    ] {
        let flags = ["--dp", "2", "--zero", zero, "--dp-overlap"];
        let (two, sum, header, samples) = run(&flags[..4 + overlap as usize]);
        // ZeRO-2/3 sum the norm's squares shard by shard: another f32 summation order over
        // gpt2-tiny's 3.2 M embedding values than a tensor at a time (≈ 1e-4 apart).
        let norm_tol = if zero >= "2" { 1e-3 } else { 1e-4 };
        same_curve(&two, &one, norm_tol, &format!("zero {zero}"));
        // The losses move: the curve is a curve, not a constant both runs share.
        assert!((one[5].0 - one[0].0).abs() > 1e-3, "{one:?}");
        let (e2, e1) = (
            sum["eval_loss"].as_f64().unwrap(),
            one_sum["eval_loss"].as_f64().unwrap(),
        );
        assert!((e2 - e1).abs() <= 1e-5 * e1, "eval {e2} vs {e1}");
        let dp = &header["dp"];
        assert_eq!(dp["size"], 2);
        assert_eq!(dp["zero_stage"], zero.parse::<u64>().unwrap());
        assert_eq!(dp["overlap"], overlap);
        assert_eq!(dp["global_batch_size"], 4);
        assert_eq!(dp["ranks"].as_array().unwrap().len(), 2);
        assert_eq!(
            sum["per_rank_peak_memory_bytes"].as_array().unwrap().len(),
            2
        );
        // ZeRO-2/3's collectives run inside the backward: no share is timed for them.
        match zero {
            "0" | "1" => assert!(sum["comm_share"].as_f64().unwrap() > 0.),
            _ => assert!(sum.get("comm_share").is_none(), "{sum}"),
        }
        // Throughput counts the global batch: 4 blocks a step over both ranks.
        assert!(samples.iter().all(|&n| n == 4), "{samples:?}");
    }
}

/// ZeRO-3 gathers blocks in the forward and again in the backward, and --recompute runs each
/// block's forward (mlp: its MLP's first half) a second time in between: with two micro-batches
/// a rank it still follows one process accumulating all four.
#[test]
fn zero3_with_recompute_and_accumulation_follows_one_process() {
    let (one, ..) = run(&["--grad-accum", "4", "--recompute"]);
    let zero3 = |recompute: &str| {
        let args = [
            "--dp",
            "2",
            "--zero",
            "3",
            "--grad-accum",
            "2",
            "--recompute",
        ];
        run(&[&args[..], &[recompute]].concat())
    };
    let (two, sum, header, _) = zero3("on");
    assert_eq!(header["dp"]["zero_stage"], 3);
    assert_eq!(header["engine_info"]["recompute"], "blocks");
    same_curve(&two, &one, 1e-3, "zero 3 + recompute");
    assert!(sum["eval_loss"].as_f64().unwrap().is_finite());
    let (mlp, _, header, _) = zero3("mlp");
    assert_eq!(header["engine_info"]["recompute"], "mlp");
    same_curve(&mlp, &one, 1e-3, "zero 3 + recompute mlp");
}

/// BLOOM trains through autograd: ZeRO-2 reduce-scatters its gradients after each
/// micro-batch's backward, and still follows one process with twice the accumulation.
#[test]
fn zero2_on_bloom_follows_one_process() {
    let (one, ..) = run(&["--model", "bloom-tiny", "--grad-accum", "2"]);
    let (two, _, header, _) = run(&["--model", "bloom-tiny", "--dp", "2", "--zero", "2"]);
    assert_eq!(header["dp"]["zero_stage"], 2);
    assert_eq!(header["engine_info"]["backward"], "autograd");
    same_curve(&two, &one, 1e-3, "bloom zero 2");
}

#[test]
fn what_dp_does_not_do_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 8] = [
        (
            &[
                "--suite",
                "wikitext2",
                "--dp",
                "2",
                "--zero",
                "3",
                "--model",
                "bloom-tiny",
            ],
            "--zero 3 gathers each block's weights inside GPT-2's manual step",
        ),
        (
            &[
                "--suite",
                "wikitext2",
                "--dp",
                "2",
                "--zero",
                "2",
                "--dp-overlap",
            ],
            "drop --dp-overlap",
        ),
        (&["--dp", "2"], "for training suites"),
        (
            &["--suite", "wikitext2", "--zero", "1"],
            "--zero is for --dp runs",
        ),
        (
            &["--suite", "wikitext2", "--dp-overlap"],
            "--dp-overlap is for --dp runs",
        ),
        (
            &["--suite", "wikitext2", "--dp", "2", "--tp", "2"],
            "cannot be combined",
        ),
        (
            &["--suite", "wikitext2", "--dp", "2", "--engine", "both"],
            "the candle engine only",
        ),
        (
            &[
                "--suite",
                "wikitext2",
                "--dp",
                "2",
                "--engine",
                "hf",
                "--zero",
                "1",
            ],
            "ZeRO-1 has no FSDP strategy",
        ),
    ];
    for (args, msg) in cases {
        let o = bench(dir.path()).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
