//! Drawing: one function per chart kind (grouped bars, lines), sharing the size, palette,
//! frame, legend and number labels.

use super::series::{Point, Table};
use super::{units, Args};
use crate::error::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub(super) const SIZE: (u32, u32) = (1280, 720);
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

/// Series `s`'s colour: the palette, then its colours lightened for series 11 to 20, and so on.
fn colour(s: usize) -> RGBColor {
    let RGBColor(r, g, b) = PALETTE[s % PALETTE.len()];
    let round = (s / PALETTE.len()) as u32;
    let light = |c: u8| (255 - (255 - c as u32) / (1 + round)) as u8;
    RGBColor(light(r), light(g), light(b))
}

fn plot_err<E: std::fmt::Debug>(e: E) -> Error {
    Error::Config(format!("drawing failed: {e:?}"))
}

/// A number for a label or an axis tick: 1234.5 -> "1235", 12.34 -> "12.3", 0.01234 ->
/// "0.012", and no trailing zeros ("0", "0.5", "40").
pub fn label(v: f64) -> String {
    let s = if v.abs() >= 100. {
        format!("{v:.0}")
    } else if v.abs() >= 1. {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    let s = crate::report::table::trim_zeros(s);
    if s == "-0" {
        "0".into()
    } else {
        s
    }
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
            t += &format!(" | batch {}", label(b));
        }
        for w in &args.filters {
            t += &format!(" | {w}");
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

fn y_max(table: &Table) -> f64 {
    table
        .values()
        .flat_map(|m| m.values().map(|p| p.hi.max(p.value)))
        .fold(0., f64::max)
}

/// The top of the y axis: room above the highest bar for its label and for the legend
/// (about 20 px a series in a plot about 580 px high), so the legend covers no bar.
fn y_top(table: &Table) -> f64 {
    let legend = (20. * table.len() as f64 + 30.) / 580.;
    y_max(table) / (1. - legend - 0.04).max(0.4)
}

/// Centred text whose bottom edge sits at the anchor.
fn centred(size: u32) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom))
}

/// Grouped bars: one group per x category, one bar per series, its value above it.
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
    let ymax = y_max(table);
    let mut chart = frame(root, args)
        .build_cartesian_2d(0f64..xs.len() as f64, 0f64..y_top(table))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(ylabel)
        .x_desc(args.x.clone())
        .y_label_formatter(&|v| label(*v))
        .axis_desc_style(("sans-serif", 20))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    let width = 0.8 / table.len() as f64;
    for (s, (series, points)) in table.iter().enumerate() {
        let color = colour(s);
        let left = |x: usize| 0.1 + x as f64 + s as f64 * width;
        let mid = |x: usize| left(x) + width * 0.46;
        let bars: Vec<(usize, Point)> = xs
            .iter()
            .enumerate()
            .filter_map(|(i, x)| points.get(x).map(|p| (i, *p)))
            .collect();
        chart
            .draw_series(bars.iter().map(|(i, p)| {
                Rectangle::new(
                    [(left(*i), 0.), (left(*i) + width * 0.92, p.value)],
                    color.filled(),
                )
            }))
            .map_err(plot_err)?
            .label(series.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart
            .draw_series(bars.iter().filter(|(_, p)| p.hi > p.lo).map(|(i, p)| {
                ErrorBar::new_vertical(mid(*i), p.lo, p.value, p.hi, BLACK.stroke_width(2), 8)
            }))
            .map_err(plot_err)?;
        chart
            .draw_series(bars.iter().map(|(i, p)| {
                let top = p.hi.max(p.value) + ymax * 0.01;
                Text::new(label(p.value), (mid(*i), top), centred(14))
            }))
            .map_err(plot_err)?;
    }
    draw_legend(&mut chart)?;
    // Category names under each group (the axis itself is numeric).
    for (i, x) in xs.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.));
        let style =
            TextStyle::from(("sans-serif", 18).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(x.clone(), (px, py + 8), style))
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
    let pad = ((xmax - xmin) * 0.05).max(0.5);
    let mut chart = frame(root, args)
        .build_cartesian_2d((xmin - pad)..(xmax + pad), 0f64..y_top(table))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .y_desc(ylabel)
        .x_desc(args.x.clone())
        .x_label_formatter(&|v| label(*v))
        .y_label_formatter(&|v| label(*v))
        .axis_desc_style(("sans-serif", 20))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    for (s, (series, points)) in table.iter().enumerate() {
        let color = colour(s);
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

pub(super) fn draw<DB: DrawingBackend>(
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

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn labels_have_no_spurious_decimals() {
        assert_eq!(label(0.), "0");
        assert_eq!(label(0.5), "0.5");
        assert_eq!(label(40.), "40");
        assert_eq!(label(12.34), "12.3");
        assert_eq!(label(2820.2), "2820");
        assert_eq!(label(0.01234), "0.012");
        assert_eq!(label(-0.0001), "0");
    }
}
