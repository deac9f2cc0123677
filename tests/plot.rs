#![cfg(feature = "report")]
//! `plot`'s defaults on small CSVs (`tests/fixtures/plot/`): what a chart groups, names and
//! compares (through the library), one golden PNG per chart kind compared pixel by pixel with
//! a tolerance for font rendering, and one-line errors (through the binary).

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use transformer_bench::report::plot::{chart, Args, Chart};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/plot")
        .join(name)
}

fn args(csv: &str, extra: &[&str]) -> Args {
    let input = fixture(csv);
    let mut a = vec!["plot", "-i", input.to_str().unwrap()];
    a.extend_from_slice(extra);
    Args::parse_from(a)
}

fn build(csv: &str, extra: &[&str]) -> Chart {
    chart(&args(csv, extra)).unwrap()
}

fn labels(c: &Chart) -> Vec<&str> {
    c.series.iter().map(|s| s.label.as_str()).collect()
}

fn group_labels(c: &Chart, panel: usize) -> Vec<&str> {
    c.panels[panel]
        .groups
        .iter()
        .map(|g| g.label.as_str())
        .collect()
}

#[test]
fn groups_are_models_by_size_times_batch_and_bars_are_engines() {
    let c = build("generation.csv", &["--metric", "decode_tokens_per_second"]);
    assert_eq!(c.panels.len(), 1);
    assert!(!c.lines);
    let want = [
        "gpt2\nbatch 1",
        "gpt2\nbatch 16",
        "bloom-560m\nbatch 1",
        "bloom-560m\nbatch 16",
    ];
    assert_eq!(group_labels(&c, 0), want);
    // Only the engine varies between bars: the legend says nothing else, the subtitle the rest.
    assert_eq!(labels(&c), ["candle", "hf", "hf-compile"]);
    assert_eq!(c.subtitle, "generation · bf16 · H100 80GB HBM3");
    let hues: Vec<usize> = c.series.iter().map(|s| s.hue).collect();
    assert_eq!(hues, [0, 1, 2]);
    // gpt2 batch 1: candle's newest build only (2200 and 2100: median 2150, range kept); the
    // older build's run is left out and counted.
    let g = &c.panels[0].groups[0];
    let (s, p) = g.points[0];
    assert_eq!((s, p.value, p.lo, p.hi), (0, 2150., 2100., 2200.));
    assert!(c
        .note
        .as_deref()
        .unwrap()
        .contains("1 older runs not drawn"));
}

#[test]
fn speedup_is_over_the_fastest_hf_engine_of_the_group() {
    let c = build("generation.csv", &["--metric", "decode_tokens_per_second"]);
    let g = &c.panels[0].groups[1]; // gpt2 batch 16: candle 29000, hf 2900, hf-compile 7700
    assert_eq!(g.speedups.len(), 1);
    let sp = g.speedups[0];
    assert_eq!((sp.series, sp.baseline), (0, 2));
    assert!((sp.ratio - 29000. / 7700.).abs() < 1e-9, "{}", sp.ratio);
    // A latency: less is better, the ratio turns over.
    let c = build("generation.csv", &["--metric", "itl_ms_p50"]);
    let sp = c.panels[0].groups[1].speedups[0];
    assert!((sp.ratio - 2.1 / 0.55).abs() < 1e-9, "{}", sp.ratio);
    // Memory is no speed: no speedup written.
    let c = build("generation.csv", &["--metric", "peak_memory_bytes"]);
    assert!(c.panels[0].groups.iter().all(|g| g.speedups.is_empty()));
}

#[test]
fn all_configs_names_settings_shortly() {
    let c = build(
        "generation.csv",
        &["--metric", "itl_ms_p50", "--all-configs"],
    );
    assert_eq!(
        labels(&c),
        [
            "candle fused all -gemv,skinny 1111111",
            "candle fused all 2222222",
            "hf eager 2222222",
            "hf-compile eager 2222222",
            "hf-compile sdpa 2222222",
        ]
    );
    // One hue an engine, a shade a variant.
    let colours: Vec<(usize, usize)> = c.series.iter().map(|s| (s.hue, s.shade)).collect();
    assert_eq!(colours, [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]);
    assert!(c.note.is_none());
    // Two candle builds compared in one group: a speedup each.
    assert_eq!(c.panels[0].groups[0].speedups.len(), 2);
}

#[test]
fn facets_split_panels_and_the_legend_keeps_what_varies_inside() {
    let c = build("lambada.csv", &["--facet", "dtype"]);
    let panels: Vec<_> = c.panels.iter().map(|p| p.label.as_deref()).collect();
    assert_eq!(panels, [Some("bf16"), Some("fp32")]);
    assert_eq!(
        labels(&c),
        [
            "candle H100 80GB HBM3",
            "candle H200",
            "hf H100 80GB HBM3",
            "hf H200"
        ]
    );
    assert_eq!(group_labels(&c, 1), ["gpt2", "bloom-560m"]);
    // Each candle bar against the HF bar of its own GPU.
    let ratios: Vec<f64> = c.panels[0].groups[0]
        .speedups
        .iter()
        .map(|s| s.ratio)
        .collect();
    assert_eq!(ratios, [1900. / 1200., 2100. / 1300.]);
    // Without --facet the GPUs become panels where they differ, and precision splits colours.
    let c = build("lambada.csv", &[]);
    let panels: Vec<_> = c.panels.iter().map(|p| p.label.as_deref()).collect();
    assert_eq!(panels, [Some("H100 80GB HBM3"), Some("H200")]);
    assert_eq!(
        labels(&c),
        ["candle bf16", "candle fp32", "hf bf16", "hf fp32"]
    );
    let hues: Vec<usize> = c.series.iter().map(|s| s.hue).collect();
    assert_eq!(hues, [0, 1, 2, 3]);
    // The design card's filters: one precision, one GPU, no panels.
    let c = build("lambada.csv", &["--metric", "samples_per_second", "--fp32"]);
    assert_eq!((c.panels.len(), labels(&c)), (1, vec!["candle", "hf"]));
}

#[test]
fn swept_numbers_draw_lines_in_numeric_order() {
    let c = build("sweep.csv", &["--x", "batch_size"]);
    assert!(c.lines);
    let xs: Vec<f64> = c.panels[0].groups.iter().map(|g| g.x).collect();
    assert_eq!(xs, [1., 4., 16., 64.]);
    assert_eq!(c.panels[0].groups[3].points[0].1.value, 1430.);
    assert_eq!(c.x_label, "batch size");
}

#[test]
fn each_strategy_and_recompute_is_a_line_of_its_own() {
    // The newer blocks run at batch 32 must not hide mlp's at 64: recompute is the workload's.
    // One engine: the label names what sets each line apart, plain dp included.
    let c = build(
        "strategies.csv",
        &["--x", "batch_size", "--metric", "tokens_per_second"],
    );
    assert_eq!(
        labels(&c),
        [
            "ZeRO-0 recompute off",
            "ZeRO-3 recompute blocks",
            "ZeRO-3 recompute mlp"
        ]
    );
    let at_64: Vec<f64> = c.panels[0].groups[2]
        .points
        .iter()
        .map(|p| p.1.value)
        .collect();
    assert_eq!(at_64, [63409., 75329.]);
}

#[test]
fn where_filters_by_any_column() {
    let c = build(
        "lambada.csv",
        &["--where", "model=gpt2", "--where", "gpu=NVIDIA H200"],
    );
    assert_eq!(c.panels.len(), 1);
    assert_eq!(group_labels(&c, 0), ["gpt2"]);
    // The model is the x axis, so the subtitle need not say it.
    assert_eq!(c.subtitle, "lambada · bf16 · H200 · batch 16");
}

/// Repeats (`--repeat 5`): the bar is their median, the error bar their min..max, not their
/// intervals'; one run: its 95 % bootstrap interval; the note says which is which.
#[test]
fn error_bars_are_the_repeats_range_or_one_run_s_interval() {
    let c = build("intervals.csv", &[]);
    let point = |g: usize, s: usize| {
        let (series, p) = c.panels[0].groups[g].points[s];
        (c.series[series].label.as_str(), p.value, p.lo, p.hi)
    };
    assert_eq!(point(0, 0), ("candle", 2810., 2429., 3071.));
    assert_eq!(point(0, 1), ("hf", 1500., 1152., 1977.));
    assert_eq!(point(1, 0), ("candle", 900., 780., 1010.));
    assert_eq!(
        c.error_bars.as_deref(),
        Some("error bars: min–max of repeats; one run: its 95 % bootstrap interval")
    );
    // No repeats, no interval: no error bar, no note; lines draw none.
    let single = build(
        "generation.csv",
        &["--metric", "itl_ms_p50", "--where", "model=bloom-560m"],
    );
    assert_eq!(single.error_bars, None);
    let lines = build("sweep.csv", &["--x", "batch_size"]);
    assert_eq!(lines.error_bars, None);
}

// --- golden PNGs ---------------------------------------------------------------------

/// `plot -i CSV -o OUT EXTRA…` through the binary.
fn plot(csv: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut a = vec!["-i", csv.to_str().unwrap(), "-o", out.to_str().unwrap()];
    a.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_plot"))
        .args(a)
        .output()
        .expect("runs")
}

/// Pixels of `got` with no pixel within one of the same place in `want` that is close in
/// colour: anti-aliasing and glyph placement move a pixel or shade it, a wrong bar or line
/// moves thousands.
fn mismatched(got: &image::RgbImage, want: &image::RgbImage) -> usize {
    assert_eq!(got.dimensions(), want.dimensions());
    let (w, h) = got.dimensions();
    let close = |a: &image::Rgb<u8>, b: &image::Rgb<u8>| {
        a.0.iter().zip(b.0).all(|(x, y)| x.abs_diff(y) <= 48)
    };
    let mut bad = 0;
    for (x, y, p) in got.enumerate_pixels() {
        let near = (x.saturating_sub(1)..=(x + 1).min(w - 1))
            .flat_map(|nx| (y.saturating_sub(1)..=(y + 1).min(h - 1)).map(move |ny| (nx, ny)));
        if !near
            .into_iter()
            .any(|(nx, ny)| close(p, want.get_pixel(nx, ny)))
        {
            bad += 1;
        }
    }
    bad
}

/// At most 0.025 % of the pixels (230 of 1280 × 720) may differ after the one-pixel slack:
/// glyphs drawn a little differently, never a bar 10 % off (about 850).
const TOLERANCE: usize = 1280 * 720 / 4000;

/// Draws the chart and compares it with `tests/fixtures/plot/NAME`; `UPDATE_GOLDEN=1`
/// rewrites the golden file.
fn golden_png(name: &str, csv: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join(name);
    let o = plot(&fixture(csv), &png, extra);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::copy(&png, fixture(name)).unwrap();
    }
    let got = image::open(&png).unwrap().to_rgb8();
    let want = image::open(fixture(name)).unwrap().to_rgb8();
    let bad = mismatched(&got, &want);
    assert!(
        bad <= TOLERANCE,
        "{name}: {bad} pixels differ (tolerance {TOLERANCE})"
    );
}

#[test]
fn golden_grouped_bars() {
    golden_png(
        "bars.png",
        "generation.csv",
        &["--metric", "decode_tokens_per_second"],
    );
}

#[test]
fn golden_error_bars() {
    golden_png("error_bars.png", "intervals.csv", &[]);
}

#[test]
fn golden_lines() {
    golden_png("lines.png", "sweep.csv", &["--x", "batch_size"]);
}

#[test]
fn golden_facets() {
    golden_png("facets.png", "lambada.csv", &["--facet", "dtype"]);
}

#[test]
fn golden_curve() {
    let curve = [
        "--curve",
        "--x",
        "requests_per_second",
        "--metric",
        "ttft_ms_p99",
    ];
    golden_png("curve.png", "serving.csv", &curve);
}

#[test]
fn the_tolerance_catches_a_wrong_chart() {
    // One HF bar 10 % lower (and its speedup changed): the grouped-bars golden must fail.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("wrong.csv");
    let text = std::fs::read_to_string(fixture("generation.csv")).unwrap();
    std::fs::write(
        &csv,
        text.replace(",16,124439808,7700,", ",16,124439808,6930,"),
    )
    .unwrap();
    let png = dir.path().join("wrong.png");
    let o = plot(&csv, &png, &["--metric", "decode_tokens_per_second"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = image::open(&png).unwrap().to_rgb8();
    let want = image::open(fixture("bars.png")).unwrap().to_rgb8();
    let bad = mismatched(&got, &want);
    assert!(bad > TOLERANCE, "a changed bar passed: {bad} pixels differ");
}

// --- errors ----------------------------------------------------------------------------

/// The run failed with exit code 2 and one line, `Error: …`, on stderr.
fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("Error: "), "{err}");
    err.trim_end().to_string()
}

#[test]
fn bad_input_fails_in_one_line_that_says_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    let csv = fixture("lambada.csv");
    for (extra, want) in [
        (vec!["--metric", "nope"], "no column 'nope'"),
        (vec!["--metric", "model"], "holds no numbers"),
        (
            vec!["--where", "model=gpt5"],
            "match --where model=gpt5 (model holds: gpt2, bloom-560m)",
        ),
        (vec!["--tf32"], "match --tf32 (dtype holds: fp32, bf16)"),
        (
            vec!["--model", "gpt2", "--where", "gpu=NVIDIA H200", "--fp32"],
            "match the filters together",
        ),
        (vec!["--facet", "nope"], "--facet nope: no such column"),
        (vec!["--x", "nope"], "--x nope: no such column"),
    ] {
        let err = one_line_error(&plot(&csv, &png, &extra));
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    let zero = dir.path().join("zero.csv");
    std::fs::write(&zero, "engine,model,samples_per_second\ncandle,gpt2,0\n").unwrap();
    let err = one_line_error(&plot(&zero, &png, &["--log-y"]));
    assert!(
        err.contains("--log-y: samples_per_second has values <= 0"),
        "{err}"
    );
}

#[test]
fn lines_of_several_models_are_panels_by_model() {
    let csv = fixture("sweep.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let two = dir.path().join("two.csv");
    let gpt2 = text
        .lines()
        .skip(1)
        .map(|l| l.replace("bloom-560m", "gpt2"));
    let all: Vec<String> = text.lines().map(String::from).chain(gpt2).collect();
    std::fs::write(&two, all.join("\n")).unwrap();
    let a = Args::parse_from(["plot", "-i", two.to_str().unwrap(), "--x", "batch_size"]);
    let c = chart(&a).unwrap();
    let panels: Vec<_> = c.panels.iter().map(|p| p.label.as_deref()).collect();
    assert_eq!(panels, [Some("bloom-560m"), Some("gpt2")]);
    assert_eq!(labels(&c), ["candle", "hf"]);
}

// --- latency–throughput curves (--curve) ----------------------------------------------

fn curve(extra: &[&str]) -> Chart {
    let mut a = vec!["--curve", "--x", "requests_per_second"];
    a.extend_from_slice(extra);
    build("serving.csv", &a)
}

/// Series `s`'s (x, y) in the order the line joins them.
fn line_of(c: &Chart, s: usize) -> Vec<(f64, f64)> {
    let of = |g: &transformer_bench::report::plot::Group| {
        let p = g.points.iter().find(|(t, _)| *t == s)?;
        Some((g.x, p.1.value))
    };
    c.panels[0].groups.iter().filter_map(of).collect()
}

#[test]
fn a_curve_is_a_line_a_configuration_its_points_in_x_order() {
    let c = curve(&["--metric", "ttft_ms_p99"]);
    assert!(c.lines && c.curve);
    assert_eq!(c.x_label, "requests/s");
    assert_eq!(labels(&c), ["batch 1", "batch 8"]);
    assert_eq!(
        c.subtitle,
        "candle · serving · gpt2 · bf16 · H100 80GB HBM3"
    );
    // Batch 1 saturates: 16 req/s offered achieves less than 4 did, so its point comes first.
    assert_eq!(line_of(&c, 0), [(0.97, 25.), (2.9, 5200.), (3.1, 420.)]);
    // Batch 8: the two runs at 16/s are one point (medians of x and y); inf (no
    // request_rate, arrivals inf) is the last.
    assert_eq!(
        line_of(&c, 1),
        [(0.98, 22.), (3.9, 30.), (14.5, 180.), (21.5, 900.)]
    );
    let xs: Vec<f64> = c.panels[0].groups.iter().map(|g| g.x).collect();
    assert!(xs.windows(2).all(|w| w[0] <= w[1]), "{xs:?}");
    // Each point is labelled with its offered rate.
    let rates = ["1/s", "1/s", "16/s", "4/s", "4/s", "16/s", "inf"];
    assert_eq!(group_labels(&c, 0), rates);
}

#[test]
fn a_curve_writes_png_and_svg_and_refuses_a_text_x_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let csv = fixture("serving.csv");
    let args = [
        "--curve",
        "--x",
        "output_tokens_per_second",
        "--metric",
        "tpot_ms_p99",
    ];
    let png = dir.path().join("c.png");
    let o = plot(&csv, &png, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (1280, 720));
    let first = *img.get_pixel(0, 0);
    assert!(
        img.pixels().filter(|p| **p != first).count() > 5000,
        "blank"
    );
    let svg = dir.path().join("c.svg");
    let o = plot(&csv, &svg, &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("polyline"),
        "no line drawn"
    );
    for (x, metric, want) in [
        (
            "model",
            "ttft_ms_p99",
            "--curve --x model: not a numeric column",
        ),
        ("nope", "ttft_ms_p99", "--x nope: no such column"),
        ("requests_per_second", "arrivals", "holds no numbers"),
    ] {
        let o = plot(&csv, &png, &["--curve", "--x", x, "--metric", metric]);
        let err = one_line_error(&o);
        assert!(err.contains(want), "{x} {metric}: {err}");
    }
}
