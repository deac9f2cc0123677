//! The `bench` binary as a user runs it: the embedded default, the log on disk, and one-line
//! errors for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use transformer_bench::log::read_log;
use transformer_bench::record::Record;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .output()
        .expect("bench runs")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The error of a failed run: stderr's last line, and its only error line. Lines before it
/// say what the run was doing when it failed (loading weights, starting the HF worker).
fn error_line(err: &str) -> String {
    let lines: Vec<&str> = err.trim_end().lines().collect();
    let last = lines.last().copied().unwrap_or_default();
    assert!(last.starts_with("Error: "), "error not printed last: {err}");
    let errors = lines.iter().filter(|l| l.contains("Error")).count();
    assert_eq!(errors, 1, "error not printed once, on one line: {err}");
    last.to_string()
}

/// Runs bench expecting failure; returns its (one-line) error.
fn error_of(args: &[&str]) -> String {
    let o = bench(args);
    assert!(!o.status.success(), "bench {args:?} should fail");
    error_line(&stderr(&o))
}

fn log_path_from(stdout: &str) -> PathBuf {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("log: "))
        .expect("log path printed");
    PathBuf::from(&line[5..])
}

#[test]
fn default_run_writes_header_batches_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench(&["--log-dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(
        stdout.contains("samples/s") && stdout.contains("accuracy"),
        "{stdout}"
    );
    let records = read_log(&log_path_from(&stdout)).unwrap();
    let Record::Header(h) = &records[0] else {
        panic!("first record is not a header")
    };
    assert_eq!(h.schema_version, 1);
    assert_eq!(
        (h.suite.as_str(), h.model.name.as_str(), h.dtype.as_str()),
        ("lambada", "gpt2-tiny", "fp32")
    );
    assert_eq!(h.data.path, "embedded:lambada_sample.jsonl");
    assert_eq!(
        h.data.sha256,
        "029ff246e681b3b141577c554246a48654bf606eeaedd91fb8d5b5bbcb52828e"
    );
    assert_eq!((h.batch_size, h.data.n_samples), (16, 100));
    let batches: Vec<_> = records
        .iter()
        .filter_map(|r| {
            if let Record::Batch(b) = r {
                Some(b)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(batches.len(), 7, "100 passages in batches of 16");
    assert_eq!(batches.iter().map(|b| b.passages.len()).sum::<usize>(), 100);
    let Some(Record::Summary(s)) = records.last() else {
        panic!("last record is not a summary")
    };
    assert_eq!(
        (s.status.as_str(), s.n_samples, s.n_batches),
        ("ok", 100, 7)
    );
    assert!(s.samples_per_second > 0. && s.latency_ms_p50 > 0. && s.peak_memory_bytes > 0);
    assert!(s.perplexity.is_finite() && s.perplexity > 1.);
    // The figures come with their 95 % bootstrap intervals, in the log and on the console.
    let within = |v: f64, lo: Option<f64>, hi: Option<f64>| {
        let (lo, hi) = (lo.unwrap(), hi.unwrap());
        assert!(lo <= v && v <= hi, "{v} not in [{lo}, {hi}]");
    };
    within(
        s.samples_per_second,
        s.samples_per_second_ci95_low,
        s.samples_per_second_ci95_high,
    );
    within(
        s.latency_ms_p50,
        s.latency_ms_p50_ci95_low,
        s.latency_ms_p50_ci95_high,
    );
    assert!(
        stdout.contains(&format!(
            "(95% CI {:.2}–",
            s.samples_per_second_ci95_low.unwrap()
        )),
        "{stdout}"
    );
    // The header holds the `bench env` report; CPU runs have FLOPs but no GPU trackers or MFU.
    assert!(!h.host.libraries.is_empty() && h.host.build_features.contains(&"report".into()));
    let achieved = s.model_flops.unwrap() / s.timed_seconds / 1e12;
    assert!((s.achieved_tflop_per_second.unwrap() - achieved).abs() < 1e-9 * achieved);
    assert_eq!((s.mfu, s.energy_joules, s.gpu_samples), (None, None, None));
}

#[test]
fn env_reports_a_cpu_only_machine_and_exits_0() {
    let o = bench(&["env", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: transformer_bench::env::EnvReport = serde_json::from_slice(&o.stdout).unwrap();
    assert!(!r.build_features.contains(&"cuda".into()) && r.n_cpus >= 1);
    let names: Vec<_> = r.libraries.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "libcuda",
            "libcudart",
            "libcublas",
            "libcublasLt",
            "libcurand",
            "libnccl"
        ]
    );
    assert!(
        r.libraries.iter().all(|l| !l.needed),
        "CPU build needs none"
    );
    let o = bench(&["env"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(
        text.contains("host") && text.contains("libraries"),
        "{text}"
    );
    if r.gpus.is_empty() {
        // This machine (CI) has no GPU: the report says so, as a note, not an error.
        assert!(r.nvml_error.is_some() || r.driver_version.is_some());
        assert!(text.contains("no NVIDIA driver / GPU found") || r.driver_version.is_some());
        assert!(r
            .problems
            .iter()
            .all(|p| p.severity != transformer_bench::env::Severity::Error));
    }
    let e = error_of(&["env", "--check-trackers"]);
    assert!(e.contains("--features cuda"), "{e}");
}

fn summary_of(args: &[&str]) -> Box<transformer_bench::record::Summary> {
    let o = bench(args);
    assert!(o.status.success(), "{}", stderr(&o));
    match read_log(&log_path_from(&String::from_utf8(o.stdout).unwrap()))
        .unwrap()
        .pop()
    {
        Some(Record::Summary(s)) => s,
        _ => panic!("no summary"),
    }
}

#[test]
fn model_dir_runs_and_batch_size_does_not_change_scores() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().to_str().unwrap();
    let model = fixture("gpt2-fixture");
    let model = model.to_str().unwrap();
    let common = [
        "--model-dir",
        model,
        "--log-dir",
        logs,
        "--limit",
        "40",
        "--warmup",
        "0",
    ];
    let a = summary_of(&[&common[..], &["--batch-size", "1"]].concat());
    let b = summary_of(&[&common[..], &["--batch-size", "16"]].concat());
    assert_eq!(a.n_samples, 40);
    assert_eq!(a.accuracy, b.accuracy);
    assert!(
        (a.perplexity - b.perplexity).abs() / a.perplexity < 1e-6,
        "{} vs {}",
        a.perplexity,
        b.perplexity
    );
}

#[test]
fn unknown_model_lists_valid_names() {
    let e = error_of(&["--model", "gpt5"]);
    assert!(
        e.contains("unknown model 'gpt5'") && e.contains("gpt2-medium") && e.contains("gpt2-xl"),
        "{e}"
    );
}

#[test]
fn missing_data_says_where_to_get_it() {
    let e = error_of(&["--data", "/nonexistent/lambada_test.jsonl"]);
    assert!(e.contains("/nonexistent/lambada_test.jsonl"), "{e}");
    assert!(
        e.contains("openaipublic")
            && e.contains("4aa8d02cd17c719165fc8a7887fddd641f43fcafa4b1c806ca8abc31fabdb226"),
        "{e}"
    );
}

#[test]
fn malformed_data_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "{\"text\": \"a good passage\"}\n{\"text\": oops}\n",
            ":2: invalid JSON",
        ),
        (
            "{\"text\": \"a good passage\"}\n\n{\"body\": \"x y\"}\n",
            ":3: expected an object with a string \"text\"",
        ),
        ("{\"text\": \"oneword\"}\n", ":1: passage has no space"),
    ];
    for (i, (content, want)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.jsonl"));
        std::fs::write(&path, content).unwrap();
        let e = error_of(&[
            "--data",
            path.to_str().unwrap(),
            "--log-dir",
            dir.path().to_str().unwrap(),
        ]);
        assert!(e.contains(&format!("bad{i}.jsonl{want}")), "{e}");
    }
    // Bad data fails before a log is created: no empty logs are left behind.
    let logs = std::fs::read_dir(dir.path()).unwrap().filter(|e| {
        e.as_ref()
            .unwrap()
            .path()
            .to_string_lossy()
            .contains("lambada_")
    });
    assert_eq!(logs.count(), 0);
}

#[test]
fn config_weights_mismatch_names_tensor_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("gpt2-fixture");
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let config = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replace("\"n_positions\": 256", "\"n_positions\": 512");
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let e = error_of(&["--model-dir", dir.path().to_str().unwrap(), "--limit", "1"]);
    assert!(
        e.contains("wpe.weight") && e.contains("[256, 32]") && e.contains("[512, 32]"),
        "{e}"
    );
}

#[test]
fn pickle_checkpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("gpt2-fixture").join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("pytorch_model.bin"), b"not loaded").unwrap();
    let e = error_of(&["--model-dir", dir.path().to_str().unwrap()]);
    assert!(
        e.contains("pickle") && e.contains("pytorch_model.bin") && e.contains("safetensors"),
        "{e}"
    );
}

#[test]
fn missing_config_json_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let e = error_of(&["--model-dir", dir.path().to_str().unwrap()]);
    assert!(e.contains("config.json not found"), "{e}");
}

#[test]
fn bad_device_and_dtype_are_rejected() {
    let o = bench(&["--device", "tpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("invalid device 'tpu': use auto, cpu, cuda or cuda:N"),
        "{}",
        stderr(&o)
    );
    let o = bench(&["--dtype", "fp64"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("possible values: auto, fp32, tf32, fp16, bf16"),
        "{}",
        stderr(&o)
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_request_in_cpu_build_names_the_feature() {
    let e = error_of(&["--device", "cuda"]);
    assert!(e.contains("--features cuda"), "{e}");
}

#[test]
fn verify_subcommand_reports_agreement() {
    let o = bench(&[
        "verify",
        "--model-dir",
        fixture("gpt2-fixture").to_str().unwrap(),
        "--tolerance",
        "1e-5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("tokens equal 23/23") && out.contains("greedy equal 23/23"),
        "{out}"
    );
}

#[test]
fn saved_random_weights_reload_to_the_same_scores() {
    let dir = tempfile::tempdir().unwrap();
    let (logs, ckpt) = (dir.path().join("logs"), dir.path().join("ckpt"));
    let (logs, ckpt) = (logs.to_str().unwrap(), ckpt.to_str().unwrap());
    let common = ["--log-dir", logs, "--limit", "24", "--warmup", "0"];
    let random = summary_of(
        &[
            &common[..],
            &[
                "--model",
                "bloom-tiny",
                "--seed",
                "5",
                "--save-weights",
                ckpt,
            ],
        ]
        .concat(),
    );
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("ckpt/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            config["model_type"].as_str(),
            config["architectures"][0].as_str()
        ),
        (Some("bloom"), Some("BloomForCausalLM"))
    );
    let reloaded = summary_of(&[&common[..], &["--model-dir", ckpt]].concat());
    assert_eq!(random.perplexity, reloaded.perplexity);
    let e = error_of(&["--model-dir", ckpt, "--save-weights", ckpt]);
    assert!(e.contains("--save-weights writes random weights"), "{e}");
}

// ---- HF engine: the Rust side of the worker protocol, with a stand-in worker (no torch) ----

fn fake_worker() -> String {
    fixture("fake_hf_worker.py").to_str().unwrap().to_string()
}

fn bench_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("bench runs")
}

fn log_paths(stdout: &str) -> Vec<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("log: "))
        .map(PathBuf::from)
        .collect()
}

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
    // Same passages, same tokens: the stand-in's ll is -1 per target token, so the HF
    // perplexity is exp(mean target length) over the candle log's own token counts.
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
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
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
    let log = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
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

/// `--recompute` trains GPT-2's manual step with checkpointed blocks: the same losses as
/// without it (dropout off), and the log says so; BLOOM (autograd) and the HF engine refuse it
/// in one line before anything loads.
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
        let log = std::fs::read_dir(dir.path())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
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
    assert_eq!((off.as_str(), on.as_str()), ("off", "blocks"));
    assert_eq!(plain, checkpointed);
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

/// `--suite wikitext2` on the built-in sample, tiny blocks, with the stand-in HF worker.
fn wikitext2_hf(engine: &str, log_dir: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let worker = fake_worker();
    let model = fixture("gpt2-fixture");
    let mut args = vec![
        "--suite",
        "wikitext2",
        "--engine",
        engine,
        "--hf-worker",
        &worker,
        "--model-dir",
        model.to_str().unwrap(),
        "--batch-size",
        "2",
        "--block-size",
        "32",
        "--max-steps",
        "4",
        "--warmup",
        "1",
        "--log-dir",
        log_dir,
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    bench_env(&args, env)
}

fn steps_of(records: &[Record]) -> Vec<&transformer_bench::record::StepRecord> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
        .collect()
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

#[test]
fn bad_sweep_and_training_inputs_are_one_line_errors() {
    let e = error_of(&[
        "--suite",
        "wikitext2",
        "--data",
        "/nonexistent/wikitext-2-raw",
    ]);
    assert!(
        e.contains("WikiText-2 data not found at /nonexistent/wikitext-2-raw"),
        "{e}"
    );
    let e = error_of(&["--suite", "wikitext2", "--block-size", "1"]);
    assert!(e.contains("--block-size 1 must be in 2..=1024"), "{e}");
    let e = error_of(&["--repeat", "0"]);
    assert!(e.contains("--repeat must be at least 1"), "{e}");
    let e = error_of(&["--seq-len", "5000", "--limit", "4"]);
    assert!(e.contains("longer than the model's 1024 positions"), "{e}");
    let e = error_of(&["--resume", "--sweep-dir", "/nonexistent/sweep"]);
    assert!(e.contains("--resume continues a sweep directory"), "{e}");
    // Training flags on a suite that does not train are refused, not silently ignored.
    let e = error_of(&["--suite", "lambada", "--phase-times"]);
    assert!(
        e.contains(
            "--phase-times is a training option: it applies to --suite wikitext2 or shakespeare, not lambada"
        ),
        "{e}"
    );
    let e = error_of(&["--max-steps", "3"]);
    assert!(e.contains("--max-steps is a training option"), "{e}");
    let bloom_manual = [
        "--suite",
        "wikitext2",
        "--model",
        "bloom-tiny",
        "--backward",
        "manual",
        "--max-steps",
        "1",
    ];
    let e = error_of(&bloom_manual);
    assert!(e.contains("--backward manual is written for GPT-2"), "{e}");
    let e = error_of(&[
        "--suite",
        "wikitext2",
        "--engine",
        "hf",
        "--backward",
        "autograd",
    ]);
    assert!(e.contains("--backward picks how the candle engine"), "{e}");
}

/// `bench`'s arguments for the stand-in HF worker on the gpt2 fixture, logging into `dir`,
/// then `extra`.
fn fake_hf_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let (worker, model) = (fake_worker(), fixture("gpt2-fixture"));
    let base = ["--engine", "hf", "--hf-worker", &worker, "--model-dir"];
    let mut args: Vec<String> = base.iter().map(|a| a.to_string()).collect();
    args.push(model.to_str().unwrap().into());
    args.extend(["--log-dir".into(), dir.to_str().unwrap().into()]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// The stand-in HF worker on the gpt2 fixture with `extra` flags and `env`, logging into `dir`:
/// the log's records and the console.
fn fake_hf_run(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Vec<Record>, String) {
    let args = fake_hf_args(dir, extra);
    let o = bench_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), env);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let log = log_paths(&stdout).pop().unwrap();
    (read_log(&log).unwrap(), stdout)
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

#[test]
fn a_run_says_what_it_loads_on_stderr_before_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let merged = dir.path().join("out.txt");
    let file = std::fs::File::create(&merged).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--limit", "16", "--log-dir", dir.path().to_str().unwrap()])
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .status()
        .unwrap();
    let out = std::fs::read_to_string(&merged).unwrap();
    assert!(status.success(), "{out}");
    let at = |needle: &str| {
        out.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?}: {out}"))
    };
    assert!(at("loading weights: gpt2-tiny (random (seed 0)) in fp32") < at("loaded weights: "));
    assert!(at("loaded weights: ") < at("  passages"), "{out}");
    // stdout alone keeps only the results: tests and scripts parse it.
    let o = bench(&["--limit", "16", "--log-dir", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(
        !stdout.contains("loading weights") && stdout.contains("  passages"),
        "{stdout}"
    );
    assert!(stderr(&o).contains("loading weights"), "{}", stderr(&o));
    // --no-progress: neither bars nor status lines.
    let o = bench(&[
        "--limit",
        "16",
        "--no-progress",
        "--log-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!stderr(&o).contains("loading weights"), "{}", stderr(&o));
}
