#![cfg(feature = "report")]
//! extract-metrics and plot as users run them: golden CSVs for committed sample logs of each
//! format (bench logs from real H100 runs, HF Trainer output from a real Trainer run, llm.c lines
//! in its printf formats), broken inputs, and a look at the PNG.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn logs(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/logs")
        .join(rel)
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs")
}

fn extract(args: &[&str]) -> Output {
    run(env!("CARGO_BIN_EXE_extract-metrics"), args)
}

/// `plot -i CSV -o OUT EXTRA…`
fn plot(csv: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["-i", csv.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(env!("CARGO_BIN_EXE_plot"), &args)
}

/// Compares with `tests/fixtures/logs/golden/NAME`; `UPDATE_GOLDEN=1` rewrites it.
fn golden(name: &str, got: &[u8]) {
    let path = logs("golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
    }
    let want =
        std::fs::read(&path).unwrap_or_else(|_| panic!("missing golden file {}", path.display()));
    assert_eq!(
        String::from_utf8_lossy(got),
        String::from_utf8_lossy(&want),
        "differs from {}",
        path.display()
    );
}

fn ok_stdout(o: &Output) -> &[u8] {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    &o.stdout
}

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

#[test]
fn png_has_the_size_and_is_not_blank() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let png = dir.path().join("fig.png");
    assert!(extract(&[
        "-i",
        "tests/fixtures/logs/bench",
        "-o",
        csv.to_str().unwrap()
    ])
    .status
    .success());
    let o = plot(&csv, &png, &["--metric", "samples_per_second", "--fp16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (1280, 720));
    let mut colours = std::collections::HashSet::new();
    for p in img.pixels() {
        colours.insert(p.0);
    }
    assert!(
        colours.len() > 20,
        "only {} colours: blank chart?",
        colours.len()
    );
    let non_white = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    assert!(non_white > 20_000, "{non_white} non-white pixels");
    // SVG too, and clear errors.
    let svg = dir.path().join("fig.svg");
    let o = plot(&csv, &svg, &["--x", "batch_size"]);
    assert!(o.status.success() && std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    let o = plot(&csv, &png, &["--metric", "nope"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no column 'nope'"));
    let o = plot(&csv, &png, &["--model", "gpt5"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no rows of"));
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
    assert_eq!(col("nvml_peak_process_memory_bytes"), "15000000000.0");
    assert_eq!(col("gpu"), "NVIDIA H100 80GB HBM3");
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
