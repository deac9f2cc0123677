//! Lines over a swept number (batch size, prompt length, GPUs): one line a series, min..max
//! error bars over repeats, the speedup over HF beside each point that has one. The x axis is
//! logarithmic (base 2) where the values span 8× or more, as batch sizes do. A curve
//! (`--curve`: x measured, [`super::curve`]) has a linear x axis from 0 with numbered ticks,
//! and each point labelled beside it with its offered load.

use super::chart::Panel;
use super::paint::{colour, plot_err, ratio, text, PanelCtx};
use crate::error::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use std::ops::Range;

type Ctx<'a, DB, Y> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>;

/// Whether the panel's x values are drawn on a log2 scale (never a curve's).
fn log_x(panel: &Panel, curve: bool) -> bool {
    if curve {
        return false;
    }
    let xs = panel.groups.iter().map(|g| g.x);
    let (min, max) = xs.fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    min > 0. && max / min >= 8.
}

/// Where x value `x` sits on the panel's (linear) axis.
fn pos(log: bool, x: f64) -> f64 {
    if log {
        x.log2()
    } else {
        x
    }
}

/// The panel's x axis, 5 % wider than its values each side; a curve's from 0.
pub(super) fn x_range(panel: &Panel, curve: bool) -> Range<f64> {
    let log = log_x(panel, curve);
    let xs: Vec<f64> = panel.groups.iter().map(|g| pos(log, g.x)).collect();
    let (min, max) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    if curve {
        let max = if max > 0. { max } else { 1. };
        return 0f64.min(min)..max * 1.1;
    }
    let pad = ((max - min) * 0.06).max(0.5);
    (min - pad)..(max + pad)
}

pub(super) fn draw<DB, Y>(c: &mut Ctx<DB, Y>, ctx: &PanelCtx<DB>) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let log = log_x(ctx.panel, ctx.chart.curve);
    for (s, series) in ctx.chart.series.iter().enumerate() {
        let colour = colour(series.hue, series.shade);
        let pts: Vec<(f64, super::chart::Point)> = ctx
            .panel
            .groups
            .iter()
            .filter_map(|g| {
                g.points
                    .iter()
                    .find(|(t, _)| *t == s)
                    .map(|(_, p)| (g.x, *p))
            })
            .map(|(x, p)| (pos(log, x), p))
            .collect();
        let line = LineSeries::new(
            pts.iter().map(|(x, p)| (*x, p.value)),
            colour.stroke_width(3),
        );
        c.draw_series(line).map_err(plot_err)?;
        let dots = pts
            .iter()
            .map(|(x, p)| Circle::new((*x, p.value), 5, colour.filled()));
        c.draw_series(dots).map_err(plot_err)?;
        let spread = pts.iter().filter(|(_, p)| p.hi > p.lo);
        c.draw_series(spread.map(|(x, p)| {
            ErrorBar::new_vertical(*x, p.lo, p.value, p.hi, colour.stroke_width(2), 8)
        }))
        .map_err(plot_err)?;
    }
    if ctx.chart.curve {
        return load_labels(c, ctx);
    }
    let y0 = c.y_range().start;
    for g in &ctx.panel.groups {
        for sp in &g.speedups {
            let Some((_, p)) = g.points.iter().find(|(s, _)| *s == sp.series) else {
                continue;
            };
            let tag = EmptyElement::at((pos(log, g.x), p.value))
                + Text::new(
                    ratio(sp.ratio),
                    (0, -10),
                    text(15, HPos::Center, VPos::Bottom),
                );
            c.draw_series([tag]).map_err(plot_err)?;
        }
        // Ticks at the values swept, not at round numbers between them.
        let (px, py) = c.backend_coord(&(pos(log, g.x), y0));
        let style = text(16, HPos::Center, VPos::Top);
        ctx.root
            .draw(&Text::new(g.label.clone(), (px, py + 6), style))
            .map_err(plot_err)?;
    }
    Ok(())
}

/// A curve's points, each labelled beside it with its offered load (`4/s`, `inf`).
fn load_labels<DB, Y>(c: &mut Ctx<DB, Y>, ctx: &PanelCtx<DB>) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64>,
{
    let style = text(13, HPos::Left, VPos::Bottom).color(&super::paint::GREY);
    for g in &ctx.panel.groups {
        for (_, p) in &g.points {
            let tag = EmptyElement::at((g.x, p.value))
                + Text::new(g.label.clone(), (6, -6), style.clone());
            c.draw_series([tag]).map_err(plot_err)?;
        }
    }
    Ok(())
}
