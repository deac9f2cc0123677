//! Drawing: the figure's frame (title, subtitle, legend, note, side-by-side panels and their
//! shared y axis) around one function per chart kind ([`super::bars`], [`super::lines`]); the
//! size, palette, fonts and number labels they share are in [`super::paint`].

use super::args::Args;
use super::chart::{Chart, Panel};
use super::fields::units;
use super::paint::{colour, label, plot_err, text, PanelCtx, GREY, SIZE, TEXT};
use super::{bars, lines};
use crate::error::{Error, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

/// The y range every panel shares, linear from 0 or (`--log-y`) logarithmic, with room
/// above the highest bar for its value and speedup labels.
pub(super) struct YRange {
    pub lo: f64,
    pub hi: f64,
}

fn y_range(chart: &Chart, log: bool, metric: &str) -> Result<YRange> {
    let points = chart
        .panels
        .iter()
        .flat_map(|p| &p.groups)
        .flat_map(|g| &g.points);
    let (mut min, mut max) = (f64::INFINITY, 0f64);
    for (_, p) in points {
        max = max.max(p.hi.max(p.value));
        min = min.min(p.lo.min(p.value));
    }
    // Room for a value label and the stacked speedups above the highest bar.
    let stack = chart.panels.iter().flat_map(|p| &p.groups);
    let stack = stack.map(|g| g.speedups.len()).max().unwrap_or(0) as f64;
    let room = 0.1 + 0.045 * stack.max(1.);
    if !log {
        let max = if max > 0. { max } else { 1. };
        return Ok(YRange {
            lo: 0.,
            hi: max * (1. + room),
        });
    }
    if min <= 0. || !min.is_finite() {
        return Err(Error::Config(format!(
            "--log-y: {metric} has values <= 0, which a log scale cannot show"
        )));
    }
    let lo = 10f64.powf((min * 0.9).log10().floor());
    Ok(YRange {
        lo,
        hi: max * (max / lo).powf(room),
    })
}

/// The whole figure: header, panels side by side, note.
pub(super) fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Chart,
    args: &Args,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let y = y_range(chart, args.log_y, &args.metric)?;
    let body = header(&root, chart, args)?;
    let body = footer(&body, chart)?;
    let panels = split_panels(&body, chart);
    for (n, (area, panel)) in panels.iter().zip(&chart.panels).enumerate() {
        let ctx = PanelCtx {
            root: &root,
            chart,
            panel,
            first: n == 0,
            args,
        };
        match args.log_y {
            true => draw_panel(area, (y.lo..y.hi).log_scale(), &ctx)?,
            false => draw_panel(area, y.lo..y.hi, &ctx)?,
        }
    }
    root.present().map_err(plot_err)
}

/// Panels side by side, each as wide as its share of the groups (bars) or equal (lines).
fn split_panels<DB: DrawingBackend>(
    body: &DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Vec<DrawingArea<DB, Shift>> {
    let weight = |p: &Panel| match chart.lines {
        true => 1.,
        false => p.groups.len() as f64 + 1.5, // + the y axis' labels
    };
    let total: f64 = chart.panels.iter().map(weight).sum();
    let width = body.dim_in_pixel().0 as f64;
    let mut at = 0.;
    let mut breaks = vec![];
    for p in &chart.panels[..chart.panels.len() - 1] {
        at += weight(p) / total * width;
        breaks.push(at as i32);
    }
    body.split_by_breakpoints(breaks, Vec::<i32>::new())
}

/// One panel: its frame and axes on the shared y range, then its bars or lines.
fn draw_panel<DB, Y>(area: &DrawingArea<DB, Shift>, y: Y, ctx: &PanelCtx<DB>) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let x: RangedCoordf64 = match ctx.chart.lines {
        true => lines::x_range(ctx.panel, ctx.chart.curve).into(),
        false => (0f64..ctx.panel.groups.len().max(1) as f64).into(),
    };
    let mut builder = ChartBuilder::on(area);
    if let Some(l) = &ctx.panel.label {
        builder.caption(l, ("sans-serif", 20).into_font().color(&TEXT));
    }
    let mut c = builder
        .margin(10)
        .x_label_area_size(if ctx.chart.lines { 55 } else { 50 })
        .y_label_area_size(if ctx.first { 85 } else { 60 })
        .build_cartesian_2d(x, y)
        .map_err(plot_err)?;
    let (ylabel, _) = units(&ctx.args.metric);
    let mut mesh = c.configure_mesh();
    // Ticks: a curve's x is measured, so numbered; lines label the values swept, bars their
    // groups (drawn by each kind).
    let x_ticks = if ctx.chart.curve { 6 } else { 0 };
    mesh.disable_x_mesh()
        .x_labels(x_ticks)
        .x_label_formatter(&|v| label(*v))
        .x_desc(ctx.chart.x_label.clone())
        .y_label_formatter(&|v| label(*v))
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(225, 225, 225))
        .axis_desc_style(("sans-serif", 18).into_font().color(&TEXT))
        .label_style(("sans-serif", 15).into_font().color(&TEXT));
    if ctx.first {
        mesh.y_desc(ylabel);
    }
    mesh.draw().map_err(plot_err)?;
    match ctx.chart.lines {
        true => lines::draw(&mut c, ctx),
        false => bars::draw(&mut c, ctx),
    }
}

/// Title, subtitle and legend across the top; returns the area below them.
fn header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &Chart,
    args: &Args,
) -> Result<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    let title = args.title.clone().unwrap_or_else(|| units(&args.metric).0);
    let mid = SIZE.0 as i32 / 2;
    let top = text(28, HPos::Center, VPos::Top);
    root.draw(&Text::new(title, (mid, 12), top))
        .map_err(plot_err)?;
    let mut y = 48;
    if !chart.subtitle.is_empty() {
        let sub = text(17, HPos::Center, VPos::Top).color(&GREY);
        root.draw(&Text::new(chart.subtitle.clone(), (mid, y), sub))
            .map_err(plot_err)?;
        y += 26;
    }
    if chart.series.len() > 1 {
        y = legend(root, chart, y + 4)?;
    }
    Ok(root.split_vertically(y + 6).1)
}

/// The legend as centred rows of swatch + label from pixel row `y`; returns the row below.
fn legend<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart, y: i32) -> Result<i32>
where
    DB::ErrorType: 'static,
{
    let font = text(16, HPos::Left, VPos::Center);
    let widths: Vec<i32> = chart
        .series
        .iter()
        .map(|s| {
            root.estimate_text_size(&s.label, &font)
                .map(|(w, _)| w as i32 + 48)
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(plot_err)?;
    // Greedy rows no wider than the canvas less its margins.
    let mut rows: Vec<Vec<usize>> = vec![vec![]];
    let mut used = 0;
    for (s, w) in widths.iter().enumerate() {
        if used + w > SIZE.0 as i32 - 60 && !rows.last().unwrap().is_empty() {
            rows.push(vec![]);
            used = 0;
        }
        rows.last_mut().unwrap().push(s);
        used += w;
    }
    let mut y = y + 10;
    for row in rows {
        let mut x = (SIZE.0 as i32 - row.iter().map(|&s| widths[s]).sum::<i32>()) / 2;
        for s in row {
            let series = &chart.series[s];
            let c = colour(series.hue, series.shade);
            if chart.lines {
                let line = PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3));
                root.draw(&line).map_err(plot_err)?;
                root.draw(&Circle::new((x + 12, y), 4, c.filled()))
                    .map_err(plot_err)?;
            } else {
                root.draw(&Rectangle::new([(x, y - 7), (x + 24, y + 7)], c.filled()))
                    .map_err(plot_err)?;
            }
            root.draw(&Text::new(series.label.clone(), (x + 30, y), font.clone()))
                .map_err(plot_err)?;
            x += widths[s];
        }
        y += 24;
    }
    Ok(y - 12)
}

/// The notes along the bottom (what a speedup is over, what was left out, what the error bars
/// are), as many on a line as fit; returns the area above them.
fn footer<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
) -> Result<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    let has_speedups = chart
        .panels
        .iter()
        .any(|p| p.groups.iter().any(|g| !g.speedups.is_empty()));
    let mut notes = vec![];
    if has_speedups {
        notes.push("×: speedup over the fastest HF bar of the same workload".to_string());
    }
    notes.extend(chart.note.clone());
    notes.extend(chart.error_bars.clone());
    if notes.is_empty() {
        return Ok(area.clone());
    }
    let (w, h) = area.dim_in_pixel();
    let style = text(14, HPos::Center, VPos::Center).color(&GREY);
    let mut lines: Vec<String> = vec![];
    for n in notes {
        let joined = lines.last().map(|l| format!("{l}  |  {n}"));
        match joined {
            Some(j) if area.estimate_text_size(&j, &style).map_err(plot_err)?.0 + 20 <= w => {
                *lines.last_mut().expect("a line") = j;
            }
            _ => lines.push(n),
        }
    }
    let (body, foot) = area.split_vertically(h as i32 - 4 - 22 * lines.len() as i32);
    for (k, line) in lines.into_iter().enumerate() {
        let at = (w as i32 / 2, 12 + 22 * k as i32);
        foot.draw(&Text::new(line, at, style.clone()))
            .map_err(plot_err)?;
    }
    Ok(body)
}
