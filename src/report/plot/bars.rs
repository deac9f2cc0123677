//! Grouped bars: one group an x category (a model, × batch size), one bar a series, its value
//! above it, its error bar ([`super::whiskers`]), the speedup over HF above the group.

use super::chart::Group;
use super::paint::{colour, label, plot_err, ratio, text, PanelCtx};
use crate::error::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

type Ctx<'a, DB, Y> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>;

/// A bar's left and right edges: the group's bars side by side over 80 % of its width.
fn edges(g: &Group, j: usize) -> (f64, f64) {
    let w = 0.8 / g.points.len() as f64;
    let left = g.x + 0.1 + j as f64 * w;
    (left, left + w * 0.9)
}

pub(super) fn draw<DB, Y>(c: &mut Ctx<DB, Y>, ctx: &PanelCtx<DB>) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let y0 = c.y_range().start;
    let labelled = labels_fit(c, ctx, y0)?;
    let size = group_font(c, ctx, y0)?;
    for g in &ctx.panel.groups {
        draw_group(c, ctx, g, y0, labelled)?;
        draw_speedups(c, ctx, g, labelled)?;
        // The group's name under the axis (the x axis itself is numeric).
        let (px, py) = c.backend_coord(&(g.x + 0.5, y0));
        for (k, line) in g.label.lines().enumerate() {
            let at = (px, py + 8 + (size as i32 + 3) * k as i32);
            let style = text(size, HPos::Center, VPos::Top);
            ctx.root
                .draw(&Text::new(line.to_string(), at, style))
                .map_err(plot_err)?;
        }
    }
    Ok(())
}

const VALUE_FONT: u32 = 14;

/// Whether every bar of the panel is wide enough for its value: all are labelled or none
/// (the axis says it), so no bar looks left out.
fn labels_fit<DB, Y>(c: &Ctx<DB, Y>, ctx: &PanelCtx<DB>, y0: f64) -> Result<bool>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let font = text(VALUE_FONT, HPos::Center, VPos::Bottom);
    for g in &ctx.panel.groups {
        let (l, r) = edges(g, 0);
        let bar_px = c.backend_coord(&(r, y0)).0 - c.backend_coord(&(l, y0)).0;
        for (_, p) in &g.points {
            let (w, _) = ctx
                .root
                .estimate_text_size(&label(p.value), &font)
                .map_err(plot_err)?;
            if w as i32 + 2 > bar_px {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The group names' font size: 17 px, smaller (down to 11) where the widest would overrun
/// its group.
fn group_font<DB, Y>(c: &Ctx<DB, Y>, ctx: &PanelCtx<DB>, y0: f64) -> Result<u32>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let group_px = (c.backend_coord(&(1., y0)).0 - c.backend_coord(&(0., y0)).0) as f64;
    let mut widest = 0f64;
    for line in ctx.panel.groups.iter().flat_map(|g| g.label.lines()) {
        let style = text(17, HPos::Center, VPos::Top);
        let (w, _) = ctx
            .root
            .estimate_text_size(line, &style)
            .map_err(plot_err)?;
        widest = widest.max(w as f64);
    }
    let size = 17. * (group_px - 8.) / widest.max(1.);
    Ok(size.clamp(11., 17.) as u32)
}

/// A group's bars, error bars (where taller than their caps) and value labels.
fn draw_group<DB, Y>(
    c: &mut Ctx<DB, Y>,
    ctx: &PanelCtx<DB>,
    g: &Group,
    y0: f64,
    labelled: bool,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let font = text(VALUE_FONT, HPos::Center, VPos::Bottom);
    for (j, (s, p)) in g.points.iter().enumerate() {
        let series = &ctx.chart.series[*s];
        let (left, right) = edges(g, j);
        let mid = (left + right) / 2.;
        let fill = colour(series.hue, series.shade).filled();
        c.draw_series([Rectangle::new([(left, y0), (right, p.value)], fill)])
            .map_err(plot_err)?;
        let span_px = c.backend_coord(&(mid, p.lo)).1 - c.backend_coord(&(mid, p.hi)).1;
        if span_px >= 4 {
            let bar = ErrorBar::new_vertical(mid, p.lo, p.value, p.hi, BLACK.stroke_width(1), 6);
            c.draw_series([bar]).map_err(plot_err)?;
        }
        if labelled {
            let tag = EmptyElement::at((mid, p.hi.max(p.value)))
                + Text::new(label(p.value), (0, -3), font.clone());
            c.draw_series([tag]).map_err(plot_err)?;
        }
    }
    Ok(())
}

/// The speedup over HF above the group: one figure where one engine is compared, else a
/// stack of them, each behind a swatch of its bar's colour.
fn draw_speedups<DB, Y>(
    c: &mut Ctx<DB, Y>,
    ctx: &PanelCtx<DB>,
    g: &Group,
    labelled: bool,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let y = g
        .points
        .iter()
        .map(|(_, p)| p.hi.max(p.value))
        .fold(0., f64::max);
    let at = (g.x + 0.5, y);
    let lift = if labelled { -22 } else { -4 };
    let compared = g
        .points
        .iter()
        .filter(|(s, _)| !ctx.chart.series[*s].baseline);
    if let ([one], 1) = (g.speedups.as_slice(), compared.count()) {
        let style = text(20, HPos::Center, VPos::Bottom);
        let tag = EmptyElement::at(at) + Text::new(ratio(one.ratio), (0, lift), style);
        return c.draw_series([tag]).map(|_| ()).map_err(plot_err);
    }
    let style = text(15, HPos::Left, VPos::Bottom);
    for (k, sp) in g.speedups.iter().enumerate() {
        let series = &ctx.chart.series[sp.series];
        let t = ratio(sp.ratio);
        let (w, _) = ctx.root.estimate_text_size(&t, &style).map_err(plot_err)?;
        let (left, bottom) = (-(w as i32 + 14) / 2, lift - 18 * k as i32);
        let swatch = [(left, bottom - 13), (left + 10, bottom - 3)];
        let fill = colour(series.hue, series.shade).filled();
        let tag = EmptyElement::at(at)
            + Rectangle::new(swatch, fill)
            + Text::new(t, (left + 14, bottom), style.clone());
        c.draw_series([tag]).map_err(plot_err)?;
    }
    Ok(())
}
