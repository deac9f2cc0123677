#![cfg(feature = "report")]
//! plot as users run it, on extract-metrics' CSV: a look at the PNG (size, not blank), SVG,
//! the default input and colours, and one-line errors. `plot.rs` has the charts' contents.

mod common;

use common::extract::*;

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

/// A CSV of two models, two engines, fp32 and bf16, on two GPUs; gpt2 candle fp32 on the
/// H100 ran twice (repeats: one bar, their median).
const TWO_MODELS: &str = "run,engine,suite,model,dtype,gpu,batch_size,samples_per_second
a,candle,lambada,gpt2,fp32,H100,16,1000
b,candle,lambada,gpt2,fp32,H100,16,1100
c,hf,lambada,gpt2,fp32,H100,16,900
d,candle,lambada,bloom-560m,fp32,H100,16,400
e,hf,lambada,bloom-560m,fp32,H100,16,350
f,candle,lambada,gpt2,fp32,H200,16,1200
g,candle,lambada,bloom-560m,fp32,H200,16,450
h,candle,lambada,gpt2,bf16,H100,16,2000
";

fn plot_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plot"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("runs")
}

#[test]
fn plot_defaults_to_out_csv_and_one_bar_colour_per_engine() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("out.csv"), TWO_MODELS).unwrap();
    let o = plot_in(dir.path(), &["--metric", "samples_per_second", "--fp32"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("wrote samples_per_second_fp32.png"), "{err}");
    let img = image::open(dir.path().join("samples_per_second_fp32.png"))
        .unwrap()
        .to_rgb8();
    assert_eq!(img.dimensions(), (1280, 720));
    // Two series (candle, hf; models are the x groups, GPUs the panels): the first two
    // palette colours fill bars, the third is not drawn. tests/plot.rs has the rest.
    let count = |rgb: [u8; 3]| img.pixels().filter(|p| p.0 == rgb).count();
    for rgb in [[31, 119, 180], [255, 127, 14]] {
        assert!(count(rgb) > 1000, "{rgb:?}: {} pixels", count(rgb));
    }
    assert_eq!(count([44, 160, 44]), 0);
}

#[test]
fn plot_bad_flag_values_fail_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("out.csv"), TWO_MODELS).unwrap();
    for (args, want) in [
        (vec!["--batch-size", "abc"], "invalid value 'abc'"),
        (vec!["--where", "model"], "expected KEY=VALUE"),
        (vec!["--where", "nope=1"], "no column 'nope'"),
        (vec!["--metric", "nope"], "no column 'nope'"),
        (vec!["-o", "x.jpg"], "must end in .png or .svg"),
        (
            vec!["-i", "missing.csv"],
            "extract-metrics -i LOGS -o missing.csv",
        ),
        (vec!["--where", "model=gpt5"], "no rows of out.csv match"),
    ] {
        let err = one_line_error(&plot_in(dir.path(), &args));
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
