//! What every chart kind draws with: the figure's size, the palette, fonts, number labels,
//! and what a panel is drawn from ([`PanelCtx`]). A leaf of `plot`: the frame (`draw`) and the
//! chart kinds (`bars`, `lines`) import it, it imports neither.

use super::args::Args;
use super::chart::{Chart, Panel};
use crate::error::Error;
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
pub(super) const TEXT: RGBColor = RGBColor(40, 40, 40);
pub(super) const GREY: RGBColor = RGBColor(100, 100, 100);

/// A series' colour: its engine's hue, lightened for each further variant of that engine.
pub(super) fn colour(hue: usize, shade: usize) -> RGBColor {
    let RGBColor(r, g, b) = PALETTE[hue % PALETTE.len()];
    let white = (shade as f64 * 0.3 + (hue / PALETTE.len()) as f64 * 0.2).min(0.75);
    let light = |c: u8| (c as f64 + (255. - c as f64) * white).round() as u8;
    RGBColor(light(r), light(g), light(b))
}

pub(super) fn plot_err<E: std::fmt::Debug>(e: E) -> Error {
    Error::Config(format!("drawing failed: {e:?}"))
}

/// Text of `size` px anchored at `h`, `v`.
pub(super) fn text(size: u32, h: HPos, v: VPos) -> TextStyle<'static> {
    ("sans-serif", size)
        .into_font()
        .color(&TEXT)
        .pos(Pos::new(h, v))
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

/// A speedup: "3.21×".
pub fn ratio(r: f64) -> String {
    format!("{r:.2}×")
}

/// What a panel is drawn from.
pub(super) struct PanelCtx<'a, DB: DrawingBackend> {
    /// The whole canvas: labels outside a plot's area are drawn on it.
    pub root: &'a DrawingArea<DB, Shift>,
    pub chart: &'a Chart,
    pub panel: &'a Panel,
    pub first: bool,
    pub args: &'a Args,
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
