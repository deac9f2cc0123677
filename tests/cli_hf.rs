//! The HF engine from the command line: the Rust side of the worker protocol, with a stand-in
//! worker (`tests/fixtures/fake_hf_worker.py`, no torch): `--engine both`, a crashing worker,
//! missing Python, `--hf-attn best` and compilations inside the timed batches.

mod common;

use common::cli::*;
use common::only_file;

#[test]
fn engine_both_writes_two_logs_and_compares_them() {
    let dir = tempfile::tempdir().unwrap();
    let worker = fake_worker();
    let model = fixture("gpt2-fixture");
    let o = bench(&[
        "--engine",
        "both",
        "--hf-worker",
        &worker,
        "--model-dir",
        model.to_str().unwrap(),
        "--log-dir",
        dir.path().to_str().unwrap(),
        "--limit",
        "40",
    ]);
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    // The stand-in's scores are fake, so the engines must be reported as disagreeing (exit 1).
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{}", stderr(&o));
    assert!(
        stdout.contains("candle vs hf") && stdout.contains("scores DISAGREE"),
        "{stdout}"
    );
    let logs = log_paths(&stdout);
    assert_eq!(logs.len(), 2);
    let candle = read_log(&logs[0]).unwrap();
    let hf = read_log(&logs[1]).unwrap();
    let (Record::Header(ch), Record::Header(hh)) = (&candle[0], &hf[0]) else {
        panic!("headers")
    };
    assert_eq!((ch.engine.as_str(), hh.engine.as_str()), ("candle", "hf"));
    assert_eq!(
        hh.engine_info.get("torch").map(String::as_str),
        Some("fake")
    );
    // --hf-attn best (the default): the stand-in's sdpa is faster on the probe batches; the
    // header and the table name the choice and both timings.
    let info = |k: &str| hh.engine_info.get(k).cloned().unwrap_or_default();
    assert_eq!(
        (info("attn"), info("attn_requested")),
        ("sdpa".into(), "best".into())
    );
    assert!(
        info("attn_chosen_by").starts_with("best of eager "),
        "{:?}",
        hh.engine_info
    );
    // 40 passages at batch 16: the warm-up (two batches and the partial last one) meets every
    // shape, so no timed batch compiles and the stand-in's compiled sdpa wins.
    assert!(
        stdout.contains(&format!(
            "hf ran attn=sdpa ({}), compile on",
            info("attn_chosen_by")
        )),
        "{stdout}"
    );
    assert_eq!(ch.data.sha256, hh.data.sha256);
    hf_scores_the_candle_logs_tokens(&candle, &hf);
}

/// Same passages, same tokens: the stand-in's ll is -1 per target token, so the HF perplexity
/// is exp(mean target length) over the candle log's own token counts; the latency is the
/// worker's own.
fn hf_scores_the_candle_logs_tokens(candle: &[Record], hf: &[Record]) {
    let n_target: Vec<usize> = candle
        .iter()
        .filter_map(|r| {
            if let Record::Batch(b) = r {
                Some(b)
            } else {
                None
            }
        })
        .flat_map(|b| b.passages.iter().map(|p| p.n_target_tokens))
        .collect();
    let want = (n_target.iter().sum::<usize>() as f64 / n_target.len() as f64).exp();
    let Some(Record::Summary(hs)) = hf.last() else {
        panic!("hf summary")
    };
    assert!(
        (hs.perplexity - want).abs() < 1e-9,
        "{} vs {want}",
        hs.perplexity
    );
    assert_eq!(
        hs.latency_ms_p50, 2.0,
        "latency is the worker's own measurement"
    );
}

#[test]
fn worker_crash_keeps_finished_records_and_shows_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    // 3 warm-up batches (the first two, the partial last of the 100 sample passages) + 1
    // timed batch succeed, then the worker dies.
    let args = fake_hf_args(dir.path(), &["--batch-size", "8"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = bench_env(&args, &[("FAKE_CRASH_AFTER", "4")]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("HF worker died") && err.contains("CUDA out of memory (fake)"),
        "{err}"
    );
    error_line(&err);
    let log = only_file(dir.path());
    let records = read_log(&log).unwrap();
    assert_eq!(records.len(), 3, "header, the one finished batch, summary");
    let Some(Record::Summary(s)) = records.last() else {
        panic!("summary")
    };
    // The worker's last words were an out-of-memory: recorded as such.
    assert_eq!((s.status.as_str(), s.n_samples), ("oom", 8));
    assert!(s
        .error
        .as_deref()
        .unwrap()
        .contains("CUDA out of memory (fake)"));
}

#[test]
fn random_weights_are_written_once_for_the_hf_engine() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let worker = fake_worker();
    let args = [
        "--engine",
        "hf",
        "--hf-worker",
        &worker,
        "--model",
        "gpt2-tiny",
        "--seed",
        "3",
        "--log-dir",
        dir.path().to_str().unwrap(),
        "--limit",
        "4",
    ];
    let env = [("BENCH_CACHE_DIR", cache.to_str().unwrap())];
    let first = bench_env(&args, &env);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stderr(&first).contains("wrote random weights (seed 3)"));
    let ckpt = cache.join("weights/gpt2-tiny-seed3-cpu");
    assert!(ckpt.join("model.safetensors").is_file() && ckpt.join("config.json").is_file());
    let second = bench_env(&args, &env);
    assert!(
        second.status.success() && !stderr(&second).contains("wrote random weights"),
        "cache reused"
    );
    let log = log_paths(&String::from_utf8(second.stdout).unwrap())
        .pop()
        .unwrap();
    let Record::Header(h) = &read_log(&log).unwrap()[0] else {
        panic!("header")
    };
    assert!(
        h.model.weights.starts_with("random (seed 3) via ") && h.seed == Some(3),
        "{}",
        h.model.weights
    );
}

#[test]
fn missing_torch_or_python_is_one_clear_line() {
    // A `torch` that fails to import, whatever this machine has installed.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("torch")).unwrap();
    std::fs::write(
        dir.path().join("torch/__init__.py"),
        "raise ImportError(\"No module named 'torch'\")\n",
    )
    .unwrap();
    let o = bench_env(
        &["--engine", "hf", "--limit", "2"],
        &[("PYTHONPATH", dir.path().to_str().unwrap())],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs torch and transformers")
            && err.contains("pip install torch transformers"),
        "{err}"
    );
    error_line(&err);
    let e = error_of(&[
        "--engine",
        "hf",
        "--python",
        "/no/such/python",
        "--limit",
        "2",
    ]);
    assert!(
        e.contains("cannot start Python '/no/such/python'") && e.contains("BENCH_PYTHON"),
        "{e}"
    );
    let e = error_of(&["--hf-attn", "sdpa"]);
    assert!(e.contains("for --engine hf or both"), "{e}");
}

#[test]
fn hf_best_probes_attention_and_compile_and_a_named_configuration_is_not_timed() {
    let dir = tempfile::tempdir().unwrap();
    let header_of = |extra: &[&str], env: &[(&str, &str)]| {
        let args = [&["--limit", "8"][..], extra].concat();
        let (mut records, _) = fake_hf_run(dir.path(), &args, env);
        let Record::Header(h) = records.remove(0) else {
            panic!("header")
        };
        h.engine_info
    };
    // A model with eager only (BLOOM in transformers 5.x): eager compiled and not are the
    // candidates. One generation batch: the warm-up meets its only shape (cold share 0), so the
    // warm times decide and the stand-in's compiled eager wins.
    let only = header_of(&["--mode", "generate"], &[("FAKE_EAGER_ONLY", "1")]);
    assert_eq!(
        (only["attn"].as_str(), only["compile"].as_str()),
        ("eager", "true")
    );
    assert_eq!(
        only["attn_chosen_by"],
        "best of eager 2.00 ms, eager+compile 1.00 ms a batch (cold share 0.00) (1 probe batch)"
    );
    assert_eq!(only["probe_compiles_eager+compile"], "1");
    assert_eq!(only["compile_requested"], "best");
    // One configuration named whole, or both flags pinned: nothing to time.
    for pinned in [
        &["--hf-config", "eager"][..],
        &["--hf-attn", "eager", "--hf-compile", "off"],
    ] {
        let given = header_of(pinned, &[]);
        assert_eq!(
            (given["attn"].as_str(), given["compile"].as_str()),
            ("eager", "false"),
            "{pinned:?}"
        );
        assert!(!given.contains_key("attn_chosen_by"), "{given:?}");
    }
}

/// Compiled HF that meets new padded lengths inside the timed batches compiles there: the
/// summary counts it and the console says why the figures include it; bucketed padding
/// (--pad-multiple, 64 by default with --hf-compile) warms every shape up and counts none.
#[test]
fn compilations_inside_the_timed_batches_are_counted_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let args = [&["--hf-config", "sdpa+compile"][..], extra].concat();
        let (records, stdout) = fake_hf_run(dir.path(), &args, &[]);
        let summary = records
            .into_iter()
            .find_map(|r| match r {
                Record::Summary(s) => Some(s),
                _ => None,
            })
            .unwrap();
        (summary.compiles_timed, stdout)
    };
    let (unbucketed, said) = run(&["--pad-multiple", "1"]);
    assert!(unbucketed.unwrap() > 0, "{said}");
    assert!(said.contains("timed compiles"), "{said}");
    let (bucketed, said) = run(&[]);
    assert_eq!(bucketed, Some(0));
    assert!(!said.contains("timed compiles"), "{said}");
}

/// `--min-batches` cycles the HF worker's batches as candle's: the same passes, the same
/// batch count, quality from the first pass (the stand-in's ll is -1 per target token, so its
/// perplexity is the one-pass value whatever the passes).
#[test]
fn engine_both_cycles_the_same_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (worker, model) = (fake_worker(), fixture("gpt2-fixture"));
    let run = |extra: &[&str]| {
        let mut args = vec!["--engine", "both", "--hf-worker", &worker, "--limit", "40"];
        args.extend(["--model-dir", model.to_str().unwrap()]);
        args.extend(["--log-dir", dir.path().to_str().unwrap()]);
        args.extend_from_slice(extra);
        let o = bench(&args);
        let stdout = String::from_utf8(o.stdout).unwrap();
        let summaries: Vec<_> = log_paths(&stdout)
            .iter()
            .map(|p| match read_log(p).unwrap().pop() {
                Some(Record::Summary(s)) => s,
                _ => panic!("no summary in {}", p.display()),
            })
            .collect();
        assert_eq!(summaries.len(), 2, "{stdout}");
        summaries
    };
    let once = run(&[]);
    let cycled = run(&["--min-batches", "5"]);
    for (c, o) in cycled.iter().zip(&once) {
        // 40 passages at batch 16: 3 batches a pass, 2 passes.
        assert_eq!(
            (c.passes, c.n_batches, c.timed_samples),
            (Some(2), 6, Some(80))
        );
        assert_eq!(
            (c.n_samples, c.accuracy, c.perplexity),
            (40, o.accuracy, o.perplexity)
        );
    }
}
