#![cfg(feature = "report")]
//! extract-metrics as users run it: golden CSVs for committed sample logs of each format
//! (bench logs from real H100 runs, HF Trainer output from a real Trainer run, llm.c lines in
//! its printf formats), one name per quantity whatever the source, integers as integers, and
//! broken inputs. Its tables are in `extract_tables.rs`, plot's runs in `plot_cli.rs`.

mod common;

use common::extract::*;

#[test]
fn bench_logs_golden_csv_including_a_killed_run() {
    let o = extract(&["-i", "tests/fixtures/logs/bench"]);
    golden("bench.csv", ok_stdout(&o));
    let csv = String::from_utf8_lossy(&o.stdout);
    assert!(
        csv.lines()
            .any(|l| l.contains("killed_mid_run") && l.contains(",partial,")),
        "{csv}"
    );
    // A training log with --phase-times (H200): its nested phase medians become columns.
    let header = csv.lines().next().unwrap();
    for col in [
        "phases_ms_p50_forward",
        "phases_ms_p50_backward",
        "phases_ms_p50_update",
    ] {
        assert!(header.split(',').any(|c| c == col), "{header}");
    }
    assert!(csv.contains(",164.714"), "{csv}"); // forward p50 ms of that log
}

#[test]
fn hf_trainer_outputs_golden_csv() {
    // A directory: all_results.json stands for train/eval_results.json (same numbers).
    let o = extract(&["-i", "tests/fixtures/logs/hf_trainer"]);
    golden("hf_trainer.csv", ok_stdout(&o));
    let csv = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        csv.lines().count(),
        1 + 3,
        "all_results.json, run_clm.log, trainer_state.json: {csv}"
    );
    assert!(!csv.contains("train_results.json"));
}

#[test]
fn llmc_logs_golden_csv_and_garbled_lines_are_counted() {
    let o = extract(&["-i", "tests/fixtures/logs/llmc/*.log"]);
    golden("llmc.csv", ok_stdout(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    // train_gpt2cu.log: 9 table/info lines + 1 garbled step line.
    assert!(
        err.contains("train_gpt2cu.log: skipped 10 unrecognised line(s) (llmc-log)"),
        "{err}"
    );
}

#[test]
fn long_and_grouped_outputs() {
    let o = extract(&["-i", "tests/fixtures/logs/llmc/main.log", "--long"]);
    golden("llmc_main_long.csv", ok_stdout(&o));
    let o = extract(&[
        "-i",
        "tests/fixtures/logs/bench",
        "--group-by",
        "model,dtype",
    ]);
    golden("bench_grouped.csv", ok_stdout(&o));
    let csv = String::from_utf8_lossy(&o.stdout);
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("model,dtype,count,") && header.contains("samples_per_second_min"),
        "{header}"
    );
}

#[test]
fn unknown_files_fail_with_the_format_list_or_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.txt");
    std::fs::write(&junk, "this is not a log\n\u{1}\u{2}binary").unwrap();
    let o = extract(&["-i", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("not a log format extract-metrics knows") && err.contains("llmc-main-log"),
        "{err}"
    );
    let llmc = logs("llmc/main.log");
    let o = extract(&[
        "-i",
        junk.to_str().unwrap(),
        llmc.to_str().unwrap(),
        "--skip-unknown",
    ]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("junk.txt: skipped"));
    let o = extract(&["-i", "/no/such/dir"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("input not found at /no/such/dir"));
    let o = extract(&["-i", "tests/fixtures/logs/bench", "--group-by", "nope"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--group-by: no column 'nope'"));
}

/// `extract-metrics -i results` on a folder as results/ keeps them: gzipped logs, notes and
/// console output (skipped, counted), and .tgz archives of logs (read as files, named
/// `ARCHIVE!MEMBER`), with the rows a plain log gives.
#[test]
fn a_results_folder_reads_its_logs_archives_included_and_skips_its_notes() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let gz = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    let bench = logs("bench");
    let plain = std::fs::read(bench.join("killed_mid_run.jsonl")).unwrap();
    let archived_name = "wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z.jsonl";
    let archived = std::fs::read(bench.join(archived_name)).unwrap();
    std::fs::write(dir.path().join("killed_mid_run.jsonl.gz"), gz(&plain)).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "what this call measured\n").unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |name: &str, bytes: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, bytes).unwrap();
    };
    add(&format!("logs/{archived_name}.gz"), &gz(&archived));
    add("logs/console.txt", b"--- a run\nexit 0\n");
    std::fs::write(dir.path().join("logs.tgz"), gz(&tar.into_inner().unwrap())).unwrap();

    let o = extract(&["-i", dir.path().to_str().unwrap()]);
    let csv = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("skipped 2 file(s) in no known format"),
        "{err}"
    );
    let files: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(files.len(), 2, "{csv}");
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(&format!("logs.tgz!logs/{archived_name}.gz"))),
        "{files:?}"
    );
    // The archived log's row is the plain log's, but for the file it came from.
    let direct = extract(&["-i", bench.join(archived_name).to_str().unwrap()]);
    let direct = String::from_utf8_lossy(ok_stdout(&direct)).into_owned();
    let cells = |table: &str, pick: &dyn Fn(&str) -> bool| {
        let mut lines = table.lines();
        let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
        let row = lines.find(|l| pick(l)).unwrap();
        header
            .into_iter()
            .zip(row.split(',').map(String::from))
            .filter(|(k, _)| k != "file")
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let from_archive = cells(&csv, &|l| l.contains("logs.tgz!"));
    for (k, v) in cells(&direct, &|_| true) {
        assert_eq!(from_archive[&k], v, "{k}");
    }
}

#[test]
fn gpu_tracker_and_mfu_fields_become_columns() {
    // A real H100 log with the summary fields a run now writes (values made up, shapes real).
    let src = logs("bench/lambada_bloom-7b1_candle_fp16_bs1_cuda0_20261121T204940Z.jsonl");
    let text = std::fs::read_to_string(src).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines[0]["gpu_index"] = 0.into();
    let summary = lines.last_mut().unwrap();
    summary["nvml_peak_process_memory_bytes"] = 15_000_000_000u64.into();
    for (k, v) in [
        ("sm_clock_mhz_median", 1980.),
        ("gpu_utilization_percent_median", 97.),
        ("energy_joules", 1234.5),
        ("joules_per_sample", 4.115),
        ("achieved_tflop_per_second", 123.4),
        ("peak_tflop_per_second", 989.4),
        ("mfu", 0.1247),
    ] {
        summary[k] = v.into();
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.jsonl");
    let body: Vec<String> = lines.iter().map(|v| v.to_string()).collect();
    std::fs::write(&log, body.join("\n") + "\n").unwrap();
    let o = extract(&["-i", log.to_str().unwrap()]);
    let csv = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    let mut rows = csv.lines().map(|l| l.split(',').collect::<Vec<_>>());
    let (head, row) = (rows.next().unwrap(), rows.next().unwrap());
    let col = |name: &str| {
        let i = head.iter().position(|h| *h == name);
        row[i.unwrap_or_else(|| panic!("no column {name} in {csv}"))]
    };
    assert_eq!(col("mfu"), "0.1247");
    assert_eq!(col("energy_joules"), "1234.5");
    assert_eq!(col("joules_per_sample"), "4.115");
    assert_eq!(col("sm_clock_mhz_median"), "1980.0");
    assert_eq!(col("achieved_tflop_per_second"), "123.4");
    // A byte count is an integer in the log, and so in the CSV.
    assert_eq!(col("nvml_peak_process_memory_bytes"), "15000000000");
    assert_eq!(col("gpu"), "NVIDIA H100 80GB HBM3");
}

/// The real H100 candle training log as engine `engine` (`hf`, compiled or not, `llmc`) would
/// have written it: header engine and `compile`, and the summary's throughput, memory and MFU
/// (values made up, shapes real), in `dir` as `name.jsonl`.
fn train_log_as(dir: &Path, name: &str, engine: &str, compile: Option<&str>, sps: f64) {
    let src = logs("bench/wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z.jsonl");
    let mut lines: Vec<serde_json::Value> = std::fs::read_to_string(src)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines[0]["engine"] = engine.into();
    if let Some(c) = compile {
        lines[0]["engine_info"]["compile"] = c.into();
    }
    let summary = lines.last_mut().unwrap();
    summary["train_samples_per_second"] = sps.into();
    summary["tokens_per_second"] = (sps * 1024.).into();
    summary["peak_memory_bytes"] = ((sps as u64) << 24).into();
    summary["mfu"] = (sps * 0.003).into();
    summary["warmup_runtime"] = 2.5.into();
    let body: Vec<String> = lines.iter().map(|v| v.to_string()).collect();
    std::fs::write(dir.join(format!("{name}.jsonl")), body.join("\n") + "\n").unwrap();
}

#[test]
fn training_logs_of_every_engine_give_the_train_csv_columns() {
    let dir = tempfile::tempdir().unwrap();
    train_log_as(dir.path(), "a_candle", "candle", None, 55.75);
    train_log_as(dir.path(), "b_hf", "hf", Some("false"), 95.0);
    train_log_as(dir.path(), "c_hf_compile", "hf", Some("true"), 120.5);
    train_log_as(dir.path(), "d_llmc", "llmc", None, 290.25);
    let cols = "run,engine,model,dtype,batch_size,train_samples_per_second,tokens_per_second,peak_memory_bytes,mfu,warmup_runtime";
    let o = extract(&["-i", dir.path().to_str().unwrap(), "--columns", cols]);
    golden("train_engines.csv", ok_stdout(&o));
    // Compiled HF is a side of its own in a ratio table, and llm.c one too.
    for pair in ["candle/hf-compile", "candle/llmc", "candle/hf"] {
        let o = extract(&[
            "-i",
            dir.path().to_str().unwrap(),
            "--ratio",
            pair,
            "--markdown",
        ]);
        let md = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
        let rows = md.lines().filter(|l| l.starts_with("| gpt2")).count();
        assert_eq!(rows, 1, "{pair}: {md}");
    }
}

/// candle's configuration (its `--backward` and `--fused`, from the header's engine_info)
/// becomes two columns, so that a manual and an autograd run stay two rows of their own; other
/// engines leave them empty.
#[test]
fn candle_backward_fused_and_scoring_become_columns() {
    let dir = tempfile::tempdir().unwrap();
    train_log_as(dir.path(), "a_manual", "candle", None, 124.0);
    train_log_as(dir.path(), "b_autograd", "candle", None, 58.5);
    train_log_as(dir.path(), "c_hf", "hf", Some("false"), 106.0);
    for (name, backward) in [
        ("a_manual", Some("manual")),
        ("b_autograd", Some("autograd")),
        ("c_hf", None),
    ] {
        let path = dir.path().join(format!("{name}.jsonl"));
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let info = &mut lines[0]["engine_info"];
        if let Some(b) = backward {
            info["backward"] = b.into();
            info["fused"] = "lt,softmax,bias-act".into();
        }
        if name == "a_manual" {
            info["scoring"] = "packed: each batch's passages end to end, no padding".into();
        }
        let body: Vec<String> = lines.iter().map(|v| v.to_string()).collect();
        std::fs::write(&path, body.join("\n") + "\n").unwrap();
    }
    let o = extract(&[
        "-i",
        dir.path().to_str().unwrap(),
        "--columns",
        "engine,backward,fused,scoring",
    ]);
    let csv = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "engine,backward,fused,scoring");
    let packed = "packed: each batch's passages end to end, no padding";
    let first = format!("candle,manual,\"lt,softmax,bias-act\",\"{packed}\"");
    assert_eq!(rows[1], first, "{csv}");
    assert_eq!(rows[2], "candle,autograd,\"lt,softmax,bias-act\",", "{csv}");
    assert_eq!(rows[3], "hf,,,", "{csv}");
}

#[test]
fn gzipped_logs_give_the_same_rows() {
    use std::io::Write;
    let src = logs("bench/lambada_bloom-7b1_candle_fp16_bs1_cuda0_20261121T204940Z.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let gz = dir
        .path()
        .join(src.file_name().unwrap())
        .with_extension("jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::default(),
    );
    enc.write_all(&std::fs::read(&src).unwrap()).unwrap();
    enc.finish().unwrap();
    let plain =
        String::from_utf8(ok_stdout(&extract(&["-i", src.to_str().unwrap()])).to_vec()).unwrap();
    let zipped =
        String::from_utf8(ok_stdout(&extract(&["-i", gz.to_str().unwrap()])).to_vec()).unwrap();
    // Identical but for the file column.
    assert_eq!(
        plain.replace(src.to_str().unwrap(), "FILE"),
        zipped.replace(gz.to_str().unwrap(), "FILE")
    );
    assert!(zipped.lines().count() == 2, "{zipped}");
}

#[test]
fn every_source_names_a_quantity_the_same_way() {
    // main_lr_norm.log is the main.log of the run whose stdout is train_gpt2cu.log (llm.c
    // prints 6 digits there, 4 in main.log; lr as %.2e there, %.6f in main.log).
    let o = extract(&[
        "-i",
        "tests/fixtures/logs/llmc/main_lr_norm.log",
        "tests/fixtures/logs/llmc/train_gpt2cu.log",
        "tests/fixtures/logs/hf_trainer/trainer_state.json",
        "tests/fixtures/logs/bench/wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z.jsonl",
    ]);
    let csv = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    let header = csv.lines().next().unwrap();
    for old in [
        "trl_last",
        "tel_last",
        "lr_last",
        "norm_last",
        "val_loss_last",
        "loss_last",
        "last_loss",
        "first_loss",
        "steps",
        "global_step",
        "step_ms_median",
    ] {
        assert!(!header.split(',').any(|c| c == old), "{old} in {header}");
    }
    let (main, out) = (row_of(&csv, "main_lr_norm"), row_of(&csv, "train_gpt2cu"));
    for (col, tol) in [
        ("train_loss_last", 5e-5),
        ("learning_rate_last", 5e-7),
        ("grad_norm_last", 5e-3),
        ("eval_loss", 5e-5),
        ("train_loss", 5e-5),
        ("n_steps", 0.),
    ] {
        let (a, b) = (cell(&main, col), cell(&out, col));
        assert!((a - b).abs() <= tol, "{col}: main.log {a} vs stdout {b}");
    }
    // Mean of the five step losses of the stdout log.
    let mean = (11.010456 + 10.947962 + 10.841220 + 10.700113 + 10.533017) / 5.;
    assert!((cell(&out, "train_loss") - mean).abs() < 1e-9);
    assert_eq!(cell(&main, "hellaswag_accuracy"), 0.25);
    // HF Trainer and the bench's own training log: the same columns.
    for run in [
        "hf_trainer",
        "wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z",
    ] {
        let r = row_of(&csv, run);
        for col in [
            "train_loss",
            "train_loss_last",
            "learning_rate_last",
            "grad_norm_last",
            "n_steps",
        ] {
            assert!(cell(&r, col).is_finite(), "{run}: {col}");
        }
    }
    let bench = row_of(
        &csv,
        "wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z",
    );
    assert_eq!(bench["train_loss_last"], "8.733603477478027");
    assert_eq!(row_of(&csv, "hf_trainer")["n_steps"], "40");
}

#[test]
fn integer_fields_are_written_as_integers() {
    let o = extract(&[
        "-i",
        "tests/fixtures/logs/bench",
        "tests/fixtures/logs/llmc",
    ]);
    let csv = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    for r in csv_rows(&csv) {
        for col in [
            "batch_size",
            "n_steps",
            "n_samples",
            "tp",
            "dp",
            "zero",
            "peak_memory_bytes",
        ] {
            if let Some(v) = r.get(col).filter(|v| !v.is_empty()) {
                assert!(v.parse::<i64>().is_ok(), "{}: {col} = {v}", r["run"]);
            }
        }
    }
    let bench = row_of(
        &csv,
        "wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z",
    );
    assert_eq!(
        (bench["batch_size"].as_str(), bench["n_steps"].as_str()),
        ("8", "23")
    );
    assert_eq!(row_of(&csv, "train_gpt2c")["n_steps"], "21"); // steps 0..=20 of the C trainer
}

#[test]
fn older_cuda_log_with_right_aligned_steps_parses() {
    let o = extract(&["-i", "tests/fixtures/logs/llmc/train_gpt2cu_aligned.log"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let csv = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    assert!(!err.contains("skipped"), "{err}");
    let r = row_of(&csv, "train_gpt2cu_aligned");
    assert_eq!(r["n_steps"], "62");
    assert_eq!(cell(&r, "train_loss_last"), 3.19817);
    assert_eq!(cell(&r, "eval_loss"), 3.41258);
    assert_eq!(cell(&r, "tokens_per_second"), 13141.);
    // Median of the steps after the first: (312.014672 + 312.4) / 2.
    assert!((cell(&r, "step_latency_ms_p50") - 312.207336).abs() < 1e-9);
}

#[test]
fn bad_flag_values_fail_in_one_line() {
    let b = "tests/fixtures/logs/bench";
    for (args, want) in [
        (
            vec!["-i", b, "--ratio", "candle"],
            "expected two engines as A/B",
        ),
        (
            vec!["-i", b, "--ratio", "candle/tgi"],
            "no finished 'tgi' run",
        ),
        (
            vec!["-i", b, "--columns", "model:zz"],
            "unknown format 'zz'",
        ),
        (vec!["-i", b, "--columns", "nope"], "no column 'nope'"),
        (vec!["-i", b, "--where", "model"], "expected KEY=VALUE"),
        (
            vec!["-i", b, "--where", "nope=1"],
            "no run has a column 'nope'",
        ),
        (
            vec!["-i", b, "--sort", "nope"],
            "--sort: no run has a column 'nope'",
        ),
        (vec!["-i", b, "--table", "nope"], "invalid value 'nope'"),
        (
            vec!["-i", b, "--table", "dp-report", "--where", "model=gpt5"],
            "no bench run logs",
        ),
    ] {
        let err = one_line_error(&extract(&args));
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let err = one_line_error(&extract(&[]));
    assert!(err.contains("--input"), "{err}");
}
