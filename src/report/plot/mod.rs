//! `plot`: CSV from extract-metrics -> PNG or SVG chart (plotters; font built in, so no system
//! fonts are needed), shaped like the charts engine comparisons publish:
//!
//! - grouped bars: x = the model (× batch size where it varies), one colour an engine (×
//!   precision where it varies), the value over each bar, error bars (min..max over repeats,
//!   one run's 95 % bootstrap interval: [`whiskers`]), and each engine's speedup over HF's
//!   written above the group;
//! - lines where x is a swept number (batch size, prompt length, tp / dp GPUs);
//! - side-by-side panels (`--facet`; by GPU when the rows come from several), one y axis.
//!
//! The legend names only what varies inside the chart; the subtitle what every bar shares.
//! [`series`] turns rows into that data, [`draw`] draws it (with what [`paint`] holds).

mod bars;
mod draw;
mod fields;
mod lines;
mod paint;
mod select;
pub mod series;
mod whiskers;

use crate::error::{Error, Result};
use clap::Parser;
use plotters::prelude::*;
use polars::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub use paint::{label, ratio};
pub use series::{build, Chart, Group, Panel, Point, Series, Speedup};

const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

#[derive(Parser, Debug)]
#[command(
    name = "plot",
    version,
    about = "Draws a chart (PNG or SVG) of one metric from an extract-metrics CSV.",
    after_help = "Examples:\n  plot --metric samples_per_second --fp32     (reads out.csv, writes samples_per_second_fp32.png)\n  plot -i out.csv -o fig.png --metric samples_per_second --bf16 --fp16 --x model --batch-size 16\n  plot -i out.csv -o mem.svg --metric peak_memory_bytes --where model=gpt2 --where suite=lambada\n  plot -i sweep.csv -o tput.png --metric samples_per_second --x batch_size\n  plot -i all.csv -o decode.png --metric decode_tokens_per_second --where suite=generation --log-y"
)]
pub struct Args {
    /// CSV written by extract-metrics.
    #[arg(short, long, value_name = "CSV", default_value = "out.csv")]
    pub input: PathBuf,
    /// Output image; the extension picks the format (.png or .svg)
    /// [default: METRIC_PRECISION….png, e.g. samples_per_second_fp32.png].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Numeric column to plot.
    #[arg(long, default_value = "samples_per_second")]
    pub metric: String,
    /// Only fp32 runs (precision flags combine; none = all precisions).
    #[arg(long)]
    pub fp32: bool,
    #[arg(long)]
    pub tf32: bool,
    #[arg(long)]
    pub fp16: bool,
    #[arg(long)]
    pub bf16: bool,
    /// Only this model.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub suite: Option<String>,
    #[arg(long)]
    pub engine: Option<String>,
    /// Only GPUs whose name contains this.
    #[arg(long)]
    pub gpu: Option<String>,
    #[arg(long)]
    pub batch_size: Option<f64>,
    /// Keep only rows whose column KEY equals VALUE (KEY!=VALUE: differs; repeatable; numbers
    /// compare as numbers).
    #[arg(long = "where", value_name = "KEY=VALUE")]
    pub filters: Vec<String>,
    /// x axis: model (× batch size where it varies), gpu or any text column: bars;
    /// batch_size, seq_len, prompt_len, new_tokens, tp or dp: lines.
    #[arg(long, default_value = "model")]
    pub x: String,
    /// Side-by-side panels, one per value of this column (dtype, gpu, suite…): auto = by GPU
    /// where the rows come from several, else for lines by model; none = one panel.
    #[arg(long, value_name = "COLUMN", default_value = "auto")]
    pub facet: String,
    /// Logarithmic y axis (values that differ by orders of magnitude).
    #[arg(long)]
    pub log_y: bool,
    /// One bar per engine setting and build (attention, --fused set, commit) instead of each
    /// engine's newest.
    #[arg(long)]
    pub all_configs: bool,
    #[arg(long)]
    pub title: Option<String>,
}

impl Args {
    /// The precisions asked for, in flag order (none = all).
    pub fn precisions(&self) -> Vec<&'static str> {
        [
            ("fp32", self.fp32),
            ("tf32", self.tf32),
            ("fp16", self.fp16),
            ("bf16", self.bf16),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(p, _)| *p)
        .collect()
    }

    /// `-o`, or `METRIC[_PRECISION…].png`.
    pub fn output_path(&self) -> PathBuf {
        self.output.clone().unwrap_or_else(|| {
            let suffix: String = self.precisions().iter().map(|p| format!("_{p}")).collect();
            PathBuf::from(format!("{}{suffix}.png", self.metric))
        })
    }
}

/// The y-axis label, and the factor that converts the column into those units.
pub(crate) fn units(metric: &str) -> (String, f64) {
    if metric.contains("bytes") {
        (
            format!("{} (GiB)", metric.replace("_bytes", "")),
            1. / (1u64 << 30) as f64,
        )
    } else if let Some(what) = metric.strip_suffix("_per_second") {
        (format!("{}/s", what.replace('_', " ")), 1.)
    } else if metric.contains("_ms") {
        (format!("{metric} (ms)"), 1.)
    } else if metric.ends_with("seconds") || metric.ends_with("runtime") {
        (format!("{metric} (s)"), 1.)
    } else {
        (metric.to_string(), 1.)
    }
}

fn read_csv(path: &Path) -> Result<DataFrame> {
    if !path.is_file() {
        return Err(Error::Config(format!(
            "{}: no such CSV; make one with `extract-metrics -i LOGS -o {}` or pass -i",
            path.display(),
            path.display()
        )));
    }
    CsvReadOptions::default()
        .with_has_header(true)
        .try_into_reader_with_file_path(Some(path.to_path_buf()))
        .and_then(|r| r.finish())
        .map_err(|e| Error::Config(format!("{}: cannot read CSV: {e}", path.display())))
}

/// The chart's data: the CSV of `-i` through the flags (what [`run`] draws).
pub fn chart(args: &Args) -> Result<Chart> {
    build(&read_csv(&args.input)?, args)
}

/// Draws the chart; returns the path written.
pub fn run(args: &Args) -> Result<PathBuf> {
    let output = args.output_path();
    let ext = output
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase());
    if !matches!(ext.as_deref(), Some("png" | "svg")) {
        return Err(Error::Config(format!(
            "{}: the output must end in .png or .svg",
            output.display()
        )));
    }
    // The built-in font: charts look the same on machines with no fonts installed.
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| Error::Config("the built-in font could not be loaded".into()))?;
    let chart = chart(args)?;
    if ext.as_deref() == Some("png") {
        let root = BitMapBackend::new(&output, paint::SIZE).into_drawing_area();
        draw::draw(root, &chart, args)?;
    } else {
        let root = SVGBackend::new(&output, paint::SIZE).into_drawing_area();
        draw::draw(root, &chart, args)?;
    }
    Ok(output)
}

/// Entry point of the `plot` binary.
pub fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => return crate::report::clap_exit(e),
    };
    match run(&args) {
        Ok(path) => {
            eprintln!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::from(2)
        }
    }
}
