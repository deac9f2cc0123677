#![cfg(feature = "report")]
//! extract-metrics' tables (golden files): Markdown with columns, formats and sort, the ratio
//! table of two engines, and the data- / tensor-parallel reports (the dp/tp logs are real H200
//! runs).

mod common;

use common::extract::*;

#[test]
fn markdown_table_with_columns_formats_and_sort() {
    let args = [
        "-i",
        "tests/fixtures/logs/bench",
        "--where",
        "suite=lambada",
        "--sort",
        "model,dtype,batch_size",
        "--columns",
        "model,dtype,batch_size=batch,status,samples_per_second:.1=samples/s,latency_ms_p50:.2=p50 ms,peak_memory_bytes:GiB.2=peak GiB,perplexity:e3=ppl,gpu",
    ];
    let mut md = args.to_vec();
    md.push("--markdown");
    let o = extract(&md);
    golden("bench.md", ok_stdout(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.starts_with("| model | dtype | batch | status | samples/s |"),
        "{text}"
    );
    // -o x.md writes the same table; the CSV of the same columns keeps full precision.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.md");
    let mut to_file = args.to_vec();
    to_file.extend(["-o", path.to_str().unwrap()]);
    assert!(extract(&to_file).status.success());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let csv = String::from_utf8_lossy(ok_stdout(&extract(&args))).into_owned();
    assert!(
        csv.starts_with("model,dtype,batch_size,status,samples_per_second,"),
        "{csv}"
    );
}

#[test]
fn ratio_table_pairs_engines_of_one_configuration() {
    let o = extract(&[
        "-i",
        "tests/fixtures/logs/bench",
        "--ratio",
        "candle/hf",
        "--markdown",
    ]);
    golden("ratio.md", ok_stdout(&o));
    // The same pair as CSV: the ratio is candle's samples/s over HF's, from the wide CSV.
    let o = extract(&["-i", "tests/fixtures/logs/bench", "--ratio", "candle/hf"]);
    let ratio = csv_rows(&String::from_utf8_lossy(ok_stdout(&o)));
    assert_eq!(ratio.len(), 1, "one finished candle/hf pair: {ratio:?}");
    let wide = String::from_utf8_lossy(ok_stdout(&extract(&["-i", "tests/fixtures/logs/bench"])))
        .into_owned();
    let c = row_of(
        &wide,
        "lambada_bloom-7b1_candle_fp16_bs1_cuda0_20261121T204940Z",
    );
    let h = row_of(
        &wide,
        "lambada_bloom-7b1_hf_fp16_bs1_cuda0_20261121T205005Z",
    );
    let want = cell(&c, "samples_per_second") / cell(&h, "samples_per_second");
    assert!((cell(&ratio[0], "samples_per_second_ratio") - want).abs() < 1e-12);
    let want = cell(&c, "latency_ms_p50") / cell(&h, "latency_ms_p50");
    assert!((cell(&ratio[0], "latency_ms_p50_ratio") - want).abs() < 1e-12);
}

#[test]
fn parallel_reports_match_the_python_scripts_tables() {
    // The dp logs are results/h200x2/dp; results/HISTORY.md has the table dp_report.py made
    // of them: dp 2 vs dp 1 × grad-accum 2, loss 5.2e-08, grad norm 0.0e+00; efficiency 0.898.
    let o = extract(&["-i", "tests/fixtures/logs/dp", "--table", "dp-report"]);
    golden("dp_report.md", ok_stdout(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        text.contains(
            "| gpt2 | fp32 | dp 2 ZeRO-0 | dp 1, grad_accum 2 | 10 | 5.2e-08 | 0.0e+00 |"
        ),
        "{text}"
    );
    assert!(
        text.contains("| gpt2 | bf16 | 2 | 0 | 16 | 17.48 | 0.898 | 10.7% | 22.02 / 22.02 |"),
        "{text}"
    );
    // The tiny tp logs of results/h200x2/tp, as tp_agreement.py printed them.
    let o = extract(&["-i", "tests/fixtures/logs/tp", "--table", "tp-agreement"]);
    golden("tp_agreement.md", ok_stdout(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("| gpt2-tiny | fp32 | 16 | tp 2 | 100 | 0.0000 / 0.0000 | 7.6e-08 | 9.0e-08 | 0.0e+00 | 0 |"), "{text}");
    let o = extract(&["-i", "tests/fixtures/logs/tp", "--table", "tp-scaling"]);
    golden("tp_scaling.md", ok_stdout(&o));
}

/// `--compare`: a group of runs against itself is 1.000 everywhere and never a change; groups
/// with no configuration in common are a one-line error.
#[test]
fn compare_sets_runs_against_a_baseline_group() {
    let dir = "tests/fixtures/logs/bench";
    let o = extract(&["-i", dir, "--compare", dir, "--markdown"]);
    let text = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    assert!(
        text.contains("| ratio |") && text.contains("| change |"),
        "{text}"
    );
    let rows: Vec<&str> = text.lines().skip(2).collect();
    assert!(!rows.is_empty(), "{text}");
    for row in rows {
        assert!(row.contains("| 1.000 |"), "{row}");
        assert!(
            row.ends_with("| within noise |") || row.ends_with("| no interval |"),
            "{row}"
        );
    }
    let o = extract(&["-i", dir, "--compare", "tests/fixtures/logs/tp"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Error: --compare: no configuration"),
        "{err}"
    );
}

/// A CSV extract-metrics wrote reads back as the same rows (named; walking a folder skips it).
#[test]
fn a_csv_reads_back_as_its_rows_where_named() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("runs.csv");
    let o = extract(&[
        "-i",
        "tests/fixtures/logs/bench",
        "-o",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let again = extract(&["-i", csv.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(ok_stdout(&again)),
        std::fs::read_to_string(&csv).unwrap()
    );
    let walked = extract(&["-i", dir.path().to_str().unwrap()]);
    assert_eq!(
        one_line_error(&walked),
        "Error: no runs found in the inputs"
    );
}

/// `--markdown` alone: the columns a person compares, with the HF ratio (tp, where one run
/// used two ranks; no dp, where none did); no paths or hashes.
#[test]
fn markdown_defaults_to_the_columns_a_person_compares() {
    let o = extract(&["-i", "tests/fixtures/logs/bench", "--markdown"]);
    let text = String::from_utf8_lossy(ok_stdout(&o)).into_owned();
    let header = text.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("| model | engine | attn | dtype | batch | tp | GPU | samples/s |"),
        "{header}"
    );
    for want in [
        "p50 ms",
        "p99 ms",
        "peak GiB",
        "× HF best",
        "train samples/s",
    ] {
        assert!(header.contains(want), "{want}: {header}");
    }
    assert!(
        !header.contains("file") && !header.contains("git_commit"),
        "{header}"
    );
    // The ratio is candle's samples/s over HF's in the same folder (the --ratio pair).
    assert!(
        text.contains("| bloom-7b1 | hf | eager | fp16 | 1 |") && text.contains("| 1.00 |"),
        "{text}"
    );
}

#[test]
fn where_not_equal_keeps_the_other_rows() {
    let all = extract(&["-i", "tests/fixtures/logs/bench"]);
    let all = csv_rows(&String::from_utf8_lossy(ok_stdout(&all)));
    let o = extract(&["-i", "tests/fixtures/logs/bench", "--where", "engine!=hf"]);
    let rows = csv_rows(&String::from_utf8_lossy(ok_stdout(&o)));
    let hf = all.iter().filter(|r| r["engine"] == "hf").count();
    assert!(hf > 0 && rows.len() == all.len() - hf, "{rows:?}");
    assert!(rows.iter().all(|r| r["engine"] != "hf"));
}
