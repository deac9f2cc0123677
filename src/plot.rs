//! `plot`: CSV from extract-metrics -> PNG or SVG chart (plotters; font built in, so no system
//! fonts are needed).
//!
//! - default: grouped bars, x = `--x` category (GPU type unless told), one bar per
//!   engine × precision, value labels, error bars (min..max) where a group holds repeats or the
//!   CSV has `METRIC_min` / `METRIC_max` columns (`extract-metrics --group-by`);
//! - `--x batch_size` or `--x seq_len`: one line per engine × precision.

use crate::error::{Error, Result};
use crate::extract::{column_names, polars_err};
use clap::Parser;
use plotters::coord::Shift;
use plotters::prelude::*;
use polars::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
const SIZE: (u32, u32) = (1280, 720);
/// Tableau 10: distinguishable, colour-blind friendlier than pure hues.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

#[derive(Parser, Debug)]
#[command(
    name = "plot",
    version,
    about = "Draws a chart (PNG or SVG) of one metric from an extract-metrics CSV.",
    after_help = "Examples:\n  plot -i out.csv -o fig.png --metric samples_per_second --bf16 --fp16 --x model --batch-size 16\n  plot -i out.csv -o mem.svg --metric peak_memory_bytes --model gpt2\n  plot -i sweep.csv -o tput.png --metric samples_per_second --x batch_size"
)]
pub struct Args {
    /// CSV written by extract-metrics.
    #[arg(short, long, value_name = "CSV")]
    pub input: PathBuf,
    /// Output image; the extension picks the format (.png or .svg).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
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
    /// x axis: gpu, model or any text column (bars); batch_size or seq_len (lines).
    #[arg(long, default_value = "gpu")]
    pub x: String,
    #[arg(long)]
    pub title: Option<String>,
}

/// The y-axis label, and the factor that converts the column into those units.
fn units(metric: &str) -> (String, f64) {
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

fn text_column(df: &DataFrame, name: &str) -> Result<Vec<Option<String>>> {
    let c = df
        .column(name)
        .map_err(polars_err)?
        .cast(&DataType::String)
        .map_err(polars_err)?;
    Ok(c.str()
        .map_err(polars_err)?
        .iter()
        .map(|v| v.map(str::to_string))
        .collect())
}

fn number_column(df: &DataFrame, name: &str) -> Result<Vec<Option<f64>>> {
    let c = df
        .column(name)
        .map_err(polars_err)?
        .cast(&DataType::Float64)
        .map_err(polars_err)?;
    Ok(c.f64().map_err(polars_err)?.iter().collect())
}

/// One plotted value: median of the matching rows, with a min..max range.
#[derive(Clone, Copy, Debug)]
struct Point {
    value: f64,
    lo: f64,
    hi: f64,
}

/// series -> x -> point.
type Table = BTreeMap<String, BTreeMap<String, Point>>;

fn gather(df: &DataFrame, args: &Args) -> Result<(Table, Vec<String>)> {
    let has = |c: &str| df.column(c).is_ok();
    if !has(&args.metric) {
        return Err(Error::Config(format!(
            "no column '{}' in {} (columns: {})",
            args.metric,
            args.input.display(),
            column_names(df)
        )));
    }
    if !has(&args.x) {
        return Err(Error::Config(format!(
            "--x {}: no such column (columns: {})",
            args.x,
            column_names(df)
        )));
    }
    let n = df.height();
    let text = |c: &str| -> Result<Vec<Option<String>>> {
        if has(c) {
            text_column(df, c)
        } else {
            Ok(vec![None; n])
        }
    };
    let (dtype, model, suite, engine, gpu, attn) = (
        text("dtype")?,
        text("model")?,
        text("suite")?,
        text("engine")?,
        text("gpu")?,
        text("attn")?,
    );
    let batch = if has("batch_size") {
        number_column(df, "batch_size")?
    } else {
        vec![None; n]
    };
    let value = number_column(df, &args.metric)?;
    let lo_col = if has(&format!("{}_min", args.metric)) {
        Some(number_column(df, &format!("{}_min", args.metric))?)
    } else {
        None
    };
    let hi_col = if has(&format!("{}_max", args.metric)) {
        Some(number_column(df, &format!("{}_max", args.metric))?)
    } else {
        None
    };
    let xs = text_column(df, &args.x)?;
    let precisions: Vec<&str> = [
        ("fp32", args.fp32),
        ("tf32", args.tf32),
        ("fp16", args.fp16),
        ("bf16", args.bf16),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(p, _)| *p)
    .collect();
    let is = |v: &Option<String>, want: &Option<String>| {
        want.as_ref()
            .is_none_or(|w| v.as_deref() == Some(w.as_str()))
    };
    let (_, scale) = units(&args.metric);
    // (series, x) -> (value, lo, hi) of every matching row.
    let mut raw: BTreeMap<(String, String), Vec<Point>> = BTreeMap::new();
    let mut x_order: Vec<String> = vec![];
    for i in 0..n {
        let Some(v) = value[i] else { continue };
        if !(precisions.is_empty() || dtype[i].as_deref().is_some_and(|d| precisions.contains(&d)))
        {
            continue;
        }
        let gpu_ok = args.gpu.as_ref().is_none_or(|g| {
            gpu[i]
                .as_deref()
                .is_some_and(|name| name.contains(g.as_str()))
        });
        let batch_ok = args.batch_size.is_none_or(|b| batch[i] == Some(b));
        if !(is(&model[i], &args.model)
            && is(&suite[i], &args.suite)
            && is(&engine[i], &args.engine)
            && gpu_ok
            && batch_ok)
        {
            continue;
        }
        let Some(x) = xs[i].clone() else { continue };
        let mut name = engine[i].clone().unwrap_or_else(|| "?".into());
        if let Some(a) = &attn[i] {
            if name == "hf" {
                name = format!("hf-{a}");
            }
        }
        let series = format!("{name} {}", dtype[i].as_deref().unwrap_or(""));
        let lo = lo_col.as_ref().and_then(|c| c[i]).unwrap_or(v);
        let hi = hi_col.as_ref().and_then(|c| c[i]).unwrap_or(v);
        if !x_order.contains(&x) {
            x_order.push(x.clone());
        }
        raw.entry((series, x)).or_default().push(Point {
            value: v * scale,
            lo: lo * scale,
            hi: hi * scale,
        });
    }
    if raw.is_empty() {
        return Err(Error::Config(format!(
            "no rows of {} match the filters",
            args.input.display()
        )));
    }
    let mut table = Table::new();
    for ((series, x), mut pts) in raw {
        pts.sort_by(|a, b| a.value.total_cmp(&b.value));
        let vals: Vec<f64> = pts.iter().map(|p| p.value).collect();
        let point = Point {
            value: crate::metrics::percentile(&vals, 50.),
            lo: pts.iter().map(|p| p.lo).fold(f64::INFINITY, f64::min),
            hi: pts.iter().map(|p| p.hi).fold(f64::NEG_INFINITY, f64::max),
        };
        table.entry(series).or_default().insert(x, point);
    }
    Ok((table, x_order))
}

fn plot_err<E: std::fmt::Debug>(e: E) -> Error {
    Error::Config(format!("drawing failed: {e:?}"))
}

fn title(args: &Args) -> String {
    args.title.clone().unwrap_or_else(|| {
        let mut t = args.metric.clone();
        for (k, v) in [
            ("model", &args.model),
            ("suite", &args.suite),
            ("engine", &args.engine),
            ("gpu", &args.gpu),
        ] {
            if let Some(v) = v {
                t += &format!(" | {k} {v}");
            }
        }
        if let Some(b) = args.batch_size {
            t += &format!(" | batch {b}");
        }
        t
    })
}

/// Title, margins and axis-label room every chart kind shares.
fn frame<'a, 'b, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    args: &Args,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title(args), ("sans-serif", 30))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90);
    builder
}

/// The legend box every chart kind shares.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_err)
}

/// Grouped bars: one group per x category, one bar per series.
fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    table: &Table,
    xs: &[String],
    args: &Args,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (ylabel, _) = units(&args.metric);
    let ymax = table
        .values()
        .flat_map(|m| m.values().map(|p| p.hi.max(p.value)))
        .fold(0., f64::max);
    let n_series = table.len() as f64;
    let mut chart = frame(root, args)
        .build_cartesian_2d(0f64..xs.len() as f64, 0f64..ymax * 1.18)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(ylabel)
        .x_desc(args.x.clone())
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style(("sans-serif", 20))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    let width = 0.8 / n_series;
    for (s, (series, points)) in table.iter().enumerate() {
        let color = PALETTE[s % PALETTE.len()];
        let bar = |x: usize| 0.1 + x as f64 + s as f64 * width;
        let bars = xs
            .iter()
            .enumerate()
            .filter_map(|(i, x)| points.get(x).map(|p| (i, *p)));
        chart
            .draw_series(bars.clone().map(|(i, p)| {
                Rectangle::new(
                    [(bar(i), 0.), (bar(i) + width * 0.92, p.value)],
                    color.filled(),
                )
            }))
            .map_err(plot_err)?
            .label(series.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart
            .draw_series(bars.clone().filter(|(_, p)| p.hi > p.lo).map(|(i, p)| {
                ErrorBar::new_vertical(
                    bar(i) + width * 0.46,
                    p.lo,
                    p.value,
                    p.hi,
                    BLACK.stroke_width(2),
                    8,
                )
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(bars.map(|(i, p)| {
                Text::new(
                    short(p.value),
                    (bar(i) + width * 0.05, p.hi.max(p.value) + ymax * 0.02),
                    ("sans-serif", 14),
                )
            }))
            .map_err(plot_err)?;
    }
    draw_legend(&mut chart)?;
    // Category names under each group (the axis itself is numeric).
    for (i, x) in xs.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.));
        let w = (x.len() as i32) * 4;
        root.draw(&Text::new(x.clone(), (px - w, py + 10), ("sans-serif", 18)))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// Lines over a numeric x (batch size, sequence length).
fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    table: &Table,
    args: &Args,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (ylabel, _) = units(&args.metric);
    let num = |x: &str| x.parse::<f64>().ok();
    let xs: Vec<f64> = table
        .values()
        .flat_map(|m| m.keys().filter_map(|k| num(k)))
        .collect();
    if xs.is_empty() {
        return Err(Error::Config(format!(
            "--x {}: no numeric values to draw lines over",
            args.x
        )));
    }
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let ymax = table
        .values()
        .flat_map(|m| m.values().map(|p| p.hi.max(p.value)))
        .fold(0., f64::max);
    let pad = ((xmax - xmin) * 0.05).max(0.5);
    let mut chart = frame(root, args)
        .build_cartesian_2d((xmin - pad)..(xmax + pad), 0f64..ymax * 1.15)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .y_desc(ylabel)
        .x_desc(args.x.clone())
        .y_label_formatter(&|v| short(*v))
        .axis_desc_style(("sans-serif", 20))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    for (s, (series, points)) in table.iter().enumerate() {
        let color = PALETTE[s % PALETTE.len()];
        let mut pts: Vec<(f64, Point)> = points
            .iter()
            .filter_map(|(x, p)| num(x).map(|x| (x, *p)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|(x, p)| (*x, p.value)),
                color.stroke_width(3),
            ))
            .map_err(plot_err)?
            .label(series.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(3))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|(x, p)| Circle::new((*x, p.value), 5, color.filled())),
            )
            .map_err(plot_err)?;
        chart
            .draw_series(pts.iter().filter(|(_, p)| p.hi > p.lo).map(|(x, p)| {
                ErrorBar::new_vertical(*x, p.lo, p.value, p.hi, color.stroke_width(2), 8)
            }))
            .map_err(plot_err)?;
    }
    draw_legend(&mut chart)?;
    Ok(())
}

/// 1234.5 -> "1235", 12.345 -> "12.3", 0.01234 -> "0.0123".
fn short(v: f64) -> String {
    if v.abs() >= 100. {
        format!("{v:.0}")
    } else if v.abs() >= 1. {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    table: &Table,
    xs: &[String],
    args: &Args,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    if matches!(args.x.as_str(), "batch_size" | "seq_len") {
        draw_lines(&root, table, args)?;
    } else {
        draw_bars(&root, table, xs, args)?;
    }
    root.present().map_err(plot_err)
}

pub fn run(args: &Args) -> Result<()> {
    // The built-in font: charts look the same on machines with no fonts installed.
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| Error::Config("the built-in font could not be loaded".into()))?;
    let df = CsvReadOptions::default()
        .with_has_header(true)
        .try_into_reader_with_file_path(Some(args.input.clone()))
        .and_then(|r| r.finish())
        .map_err(|e| Error::Config(format!("{}: cannot read CSV: {e}", args.input.display())))?;
    let (table, xs) = gather(&df, args)?;
    let ext = args
        .output
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase());
    match ext.as_deref() {
        Some("png") => draw(
            BitMapBackend::new(&args.output, SIZE).into_drawing_area(),
            &table,
            &xs,
            args,
        ),
        Some("svg") => draw(
            SVGBackend::new(&args.output, SIZE).into_drawing_area(),
            &table,
            &xs,
            args,
        ),
        _ => Err(Error::Config(format!(
            "{}: the output must end in .png or .svg",
            args.output.display()
        ))),
    }
}

/// Entry point of the `plot` binary.
pub fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => {
            eprintln!("wrote {}", args.output.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(2)
        }
    }
}
