//! Training from the command line (`--suite wikitext2`): candle on the built-in sample,
//! `--recompute`, `--drop-last`, `--data full`, and the HF engine's training with the stand-in
//! worker.

mod common;

use common::cli::*;
use common::only_file;

#[test]
fn wikitext2_trains_on_the_builtin_sample_and_logs_hf_metric_names() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().to_str().unwrap();
    let out = bench(&[
        "--suite",
        "wikitext2",
        "--batch-size",
        "2",
        "--block-size",
        "32",
        "--max-steps",
        "4",
        "--warmup",
        "1",
        "--lr",
        "1e-3",
        "--log-dir",
        log_dir,
        "--no-progress",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("train_samples_per_second") && stdout.contains("perplexity"));
    let log = only_file(dir.path());
    let records = read_log(&log).unwrap();
    let Record::Header(h) = &records[0] else {
        panic!("header first")
    };
    assert!(h.train.as_ref().unwrap().note.contains("wiki.valid.raw"));
    // GPT-2 trains through the manual step unless told otherwise; HF's ragged last batch is kept.
    assert_eq!(h.engine_info["backward"], "manual");
    assert!(!h.train.as_ref().unwrap().drop_last);
    let steps: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(steps.len(), 4);
    assert!(steps[0].warmup && !steps[1].warmup);
    let Some(Record::TrainSummary(s)) = records.last() else {
        panic!("train summary last")
    };
    assert_eq!(s.status, "ok");
    assert!(s.eval_loss.is_finite() && (s.perplexity - s.eval_loss.exp()).abs() < 1e-9);
    assert!(s.train_samples_per_second > 0. && s.warmup_steps == 1);
}

/// `--recompute` (blocks) and `--recompute mlp` train GPT-2's manual step with checkpointed
/// blocks: the same losses as without it (dropout off), and the log says which; BLOOM
/// (autograd), llm.c and (for mlp) the HF engine refuse it in one line before anything loads.
#[test]
fn recompute_trains_with_the_same_losses_and_is_refused_where_it_does_not_apply() {
    let losses = |extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--suite",
            "wikitext2",
            "--batch-size",
            "2",
            "--block-size",
            "32",
            "--max-steps",
            "3",
            "--warmup",
            "1",
            "--lr",
            "1e-3",
            "--no-dropout",
            "--no-progress",
            "--log-dir",
        ];
        args.push(dir.path().to_str().unwrap());
        args.extend(extra);
        let out = bench(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = only_file(dir.path());
        let records = read_log(&log).unwrap();
        let Record::Header(h) = &records[0] else {
            panic!("header first")
        };
        let recompute = h.engine_info["recompute"].clone();
        let steps: Vec<f64> = records
            .iter()
            .filter_map(|r| match r {
                Record::Step(s) => Some(s.loss),
                _ => None,
            })
            .collect();
        (recompute, steps)
    };
    let (off, plain) = losses(&[]);
    let (on, checkpointed) = losses(&["--recompute"]);
    let (mlp, half_kept) = losses(&["--recompute", "mlp"]);
    assert_eq!(
        (off.as_str(), on.as_str(), mlp.as_str()),
        ("off", "blocks", "mlp")
    );
    assert_eq!(plain, checkpointed);
    assert_eq!(plain, half_kept);
    let e = error_of(&[
        "--suite",
        "wikitext2",
        "--model",
        "bloom-tiny",
        "--recompute",
    ]);
    assert!(
        e.contains("--recompute") && e.contains("--backward autograd"),
        "{e}"
    );
    let e = error_of(&["--suite", "wikitext2", "--engine", "llmc", "--recompute"]);
    assert!(e.contains("use it with --engine candle or hf"), "{e}");
    let e = error_of(&[
        "--suite",
        "wikitext2",
        "--engine",
        "hf",
        "--recompute",
        "mlp",
    ]);
    assert!(e.contains("use --recompute on with --engine hf"), "{e}");
}

/// `--drop-last` with fewer blocks than one batch would train on nothing: one line that says
/// how many blocks there are and what to lower.
#[test]
fn drop_last_with_a_batch_larger_than_the_data_fails_in_one_line() {
    let e = error_of(&[
        "--suite",
        "wikitext2",
        "--drop-last",
        "--batch-size",
        "100000",
        "--block-size",
        "32",
        "--max-steps",
        "2",
    ]);
    assert!(
        e.contains("fewer than one batch of 100000") && e.contains("lower --batch-size"),
        "{e}"
    );
}

/// `--data full` for WikiText-2: the folder `wikitext-2-raw/` in `$BENCH_DATA_DIR` is used (here
/// without the train split: trains on valid, evaluates on test); offline with nothing found,
/// one line naming the folder, the zip and why nothing was downloaded.
#[test]
fn wikitext2_data_full_finds_the_folder_or_fails_in_one_line_offline() {
    let dir = tempfile::tempdir().unwrap();
    let wt = dir.path().join("wikitext-2-raw");
    std::fs::create_dir_all(&wt).unwrap();
    for f in ["wiki.valid.raw", "wiki.test.raw"] {
        std::fs::copy(Path::new("data/wikitext2_sample").join(f), wt.join(f)).unwrap();
    }
    let logs = dir.path().join("logs");
    let args = [
        "--suite",
        "wikitext2",
        "--data",
        "full",
        "--batch-size",
        "2",
        "--block-size",
        "32",
        "--max-steps",
        "2",
        "--warmup",
        "1",
        "--no-progress",
        "--log-dir",
        logs.to_str().unwrap(),
    ];
    let out = bench_env(
        &args,
        &[
            ("BENCH_DATA_DIR", dir.path().to_str().unwrap()),
            ("HF_HUB_OFFLINE", "1"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("trained on wiki.valid.raw, evaluated on wiki.test.raw"),
        "{stdout}"
    );

    let empty = tempfile::tempdir().unwrap();
    let out = bench_env(
        &args,
        &[
            ("BENCH_DATA_DIR", empty.path().to_str().unwrap()),
            ("HF_HUB_OFFLINE", "1"),
            ("HOME", empty.path().to_str().unwrap()),
        ],
    );
    assert!(!out.status.success());
    let e = error_line(&stderr(&out));
    assert!(
        e.contains("wikitext-2-raw") && e.contains("HF_HUB_OFFLINE=1"),
        "{e}"
    );
}

#[test]
fn wikitext2_hf_engine_logs_the_workers_steps_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    let o = wikitext2_hf(
        "hf",
        dir.path().to_str().unwrap(),
        &["--grad-accum", "2"],
        &[],
    );
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{stdout}{}", stderr(&o));
    let logs = log_paths(&stdout);
    assert_eq!(logs.len(), 1, "{stdout}");
    assert!(logs[0].to_string_lossy().contains("_hf_fp32_"));
    let records = read_log(&logs[0]).unwrap();
    let Record::Header(h) = &records[0] else {
        panic!("header first")
    };
    assert_eq!(h.engine, "hf");
    assert_eq!(h.engine_info.get("torch").map(String::as_str), Some("fake"));
    assert_eq!(h.train.as_ref().unwrap().grad_accum, 2);
    let steps = steps_of(&records);
    assert_eq!(steps.len(), 4);
    // The worker's own numbers, step by step; 2 micro-batches of 2 blocks each.
    assert_eq!(steps[1].loss, 9.5);
    assert_eq!(steps[0].latency_ms, 5.0);
    assert_eq!((steps[0].n_samples, steps[0].n_tokens), (4, 128));
    assert!(steps[0].warmup && !steps[1].warmup);
    let Some(Record::TrainSummary(s)) = records.last() else {
        panic!("train summary last")
    };
    assert_eq!(s.status, "ok");
    assert_eq!((s.n_steps, s.warmup_steps), (4, 1));
    assert_eq!((s.first_loss, s.last_loss), (10.0, 8.5));
    assert_eq!((s.eval_loss, s.eval_runtime), (4.0, 0.02));
    assert!((s.perplexity - 4f64.exp()).abs() < 1e-9);
    // 3 timed steps x 4 blocks in 3 x 5 ms.
    assert!((s.train_samples_per_second - 12. / 0.015).abs() < 1e-6);
    assert_eq!(s.peak_memory_bytes, 1234);
}

#[test]
fn wikitext2_engine_both_prints_the_side_by_side_table() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().to_str().unwrap();
    let o = wikitext2_hf("both", log_dir, &[], &[]);
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{stdout}{}", stderr(&o));
    for row in [
        "candle vs hf",
        "train_samples_per_second",
        "step latency p50 ms",
        "eval_loss",
        "perplexity",
        "peak memory MiB",
        "first-step loss not checked: dropout is on",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    let logs = log_paths(&stdout);
    assert_eq!(logs.len(), 2);
    let (candle, hf) = (read_log(&logs[0]).unwrap(), read_log(&logs[1]).unwrap());
    let (Record::Header(ch), Record::Header(hh)) = (&candle[0], &hf[0]) else {
        panic!("headers")
    };
    assert_eq!((ch.engine.as_str(), hh.engine.as_str()), ("candle", "hf"));
    assert_eq!(ch.model.weights, hh.model.weights);
    // Same schedule on both sides: the stand-in computes HF's from the hyper-parameters sent.
    let lr = |r: &[Record]| -> Vec<f64> { steps_of(r).iter().map(|s| s.learning_rate).collect() };
    assert_eq!(lr(&candle), lr(&hf));

    // Dropout off: the first-step losses are compared; the stand-in's fake loss (10.0) is not
    // candle's, so the run says so and exits 1.
    let o = wikitext2_hf("both", log_dir, &["--no-dropout"], &[]);
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{stdout}{}", stderr(&o));
    assert!(stdout.contains("first-step loss DISAGREES"), "{stdout}");
}

#[test]
fn wikitext2_worker_crash_keeps_finished_steps() {
    let dir = tempfile::tempdir().unwrap();
    // 2 steps finish, then the worker dies during the third.
    let o = wikitext2_hf(
        "hf",
        dir.path().to_str().unwrap(),
        &[],
        &[("FAKE_CRASH_AFTER", "2")],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("HF worker died") && err.contains("worker died (fake)"),
        "{err}"
    );
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .unwrap();
    let records = read_log(&log).unwrap();
    assert_eq!(records.len(), 4, "header, 2 finished steps, summary");
    assert_eq!(steps_of(&records).len(), 2);
    let Some(Record::TrainSummary(s)) = records.last() else {
        panic!("train summary last")
    };
    assert_eq!((s.status.as_str(), s.n_steps), ("error", 2));
    assert!(s.error.as_deref().unwrap().contains("worker died (fake)"));
    assert!(s.eval_loss.is_nan());
}
