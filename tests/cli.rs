//! The `bench` binary as a user runs it: the embedded default, the log on disk, and one-line
//! errors for bad input. The HF engine's runs are in `cli_hf.rs`, training's in `cli_train.rs`.

mod common;

use common::cli::*;

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
    // On the CPU no minimum time or count by default: one pass, and the log says so.
    assert_eq!((h.min_time_s, h.min_batches), (Some(0.), Some(0)));
    assert_eq!((s.passes, s.timed_samples), (Some(1), Some(100)));
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
    let e = error_of(&["--suite", "wikitext2", "--min-time", "5"]);
    assert!(e.contains("a training run times its steps"), "{e}");
    let e = error_of(&["--min-time", "inf", "--limit", "4"]);
    assert!(e.contains("--min-time inf: give seconds, 0 or more"), "{e}");
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

/// `--min-batches` beyond the data: the batches run again, whole passes, each timed and
/// logged with its pass; the rates count every one, accuracy and perplexity the first pass
/// (the same as a one-pass run's), and the log and the table say what was asked and ran.
#[test]
fn min_batches_beyond_the_data_cycles_and_logs_it() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().to_str().unwrap();
    let common = ["--log-dir", logs, "--limit", "24", "--batch-size", "8"];
    let once = summary_of(&common);
    let o = bench(&[&common[..], &["--min-batches", "7"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(
        stdout.contains("9 batches (3 passes; --min-time 0 s, --min-batches 7)"),
        "{stdout}"
    );
    let records = read_log(&log_path_from(&stdout)).unwrap();
    let Record::Header(h) = &records[0] else {
        panic!("header")
    };
    assert_eq!((h.min_time_s, h.min_batches), (Some(0.), Some(7)));
    let batches: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Batch(b) => Some(b),
            _ => None,
        })
        .collect();
    let passes: Vec<usize> = batches.iter().map(|b| b.pass).collect();
    assert_eq!(passes, [0, 0, 0, 1, 1, 1, 2, 2, 2], "3 batches a pass");
    assert!(batches.iter().enumerate().all(|(i, b)| b.batch == i));
    let scored: Vec<usize> = batches.iter().map(|b| b.passages.len()).collect();
    assert_eq!(
        scored,
        [8, 8, 8, 0, 0, 0, 0, 0, 0],
        "passages on the first pass"
    );
    let Some(Record::Summary(s)) = records.last() else {
        panic!("summary")
    };
    assert_eq!((s.n_samples, s.n_batches), (24, 9));
    assert_eq!((s.timed_samples, s.passes), (Some(72), Some(3)));
    let rate = 72. / s.timed_seconds;
    assert!((s.samples_per_second - rate).abs() < 1e-9 * rate);
    assert_eq!((s.accuracy, s.perplexity), (once.accuracy, once.perplexity));
}
