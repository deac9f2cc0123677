//! `plot`: CSV from extract-metrics -> PNG or SVG chart (plotters; font built in, so no system
//! fonts are needed), shaped like the charts engine comparisons publish:
//!
//! - grouped bars: x = the model (× batch size where it varies), one colour an engine (×
//!   precision where it varies), the value over each bar, error bars (min..max over repeats,
//!   one run's 95 % bootstrap interval: [`whiskers`]), and each engine's speedup over HF's
//!   written above the group;
//! - lines where x is a swept number (batch size, prompt length, tp / dp GPUs);
//! - curves (`--curve`, [`curve`]): x a measured number (a serving run's achieved requests/s),
//!   y a latency, a point a run, a line a configuration in x order, as `vllm bench sweep` plots;
//! - side-by-side panels (`--facet`; by GPU when the rows come from several), one y axis.
//!
//! The legend names only what varies inside the chart; the subtitle what every bar shares.
//! [`args`] holds the flags, [`series`] turns rows into the data of [`chart`], [`draw`] draws
//! it (with what [`paint`] holds).

mod args;
mod bars;
mod chart;
mod curve;
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

pub use args::Args;
pub use chart::{Chart, Group, Panel, Point, Series, Speedup};
pub use paint::{label, ratio};
pub use series::build;

const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");

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
    let df = read_csv(&args.input)?;
    match args.curve {
        true => curve::build(&df, args),
        false => build(&df, args),
    }
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
