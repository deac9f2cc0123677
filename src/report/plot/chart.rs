//! A chart's data, as [`super::series`] builds it from the CSV rows and [`super::draw`] draws
//! it: panels of groups, one point a series in each group, the speedups over HF.

/// One plotted value: median of the matching rows, with its error bar (lo..hi).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
}

/// A legend entry: its colour is one hue per engine (× precision), a shade per variant.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub hue: usize,
    pub shade: usize,
    /// An HF engine: the others' speedups are over it.
    pub baseline: bool,
}

/// Speedup of series `series` over the best HF series `baseline` of the same workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speedup {
    pub series: usize,
    pub baseline: usize,
    pub ratio: f64,
}

/// One x category (bars) or x value (lines).
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub label: String,
    pub x: f64,
    pub points: Vec<(usize, Point)>,
    pub speedups: Vec<Speedup>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub label: Option<String>,
    pub groups: Vec<Group>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub panels: Vec<Panel>,
    pub series: Vec<Series>,
    /// x is a swept number: lines, not bars.
    pub lines: bool,
    /// x is a measured number (`--curve`): a numbered x axis from 0, each point labelled
    /// with its offered load (lines is true too).
    pub curve: bool,
    pub x_label: String,
    /// What every plotted row shares (`generation · bf16 · H100 80GB HBM3`).
    pub subtitle: String,
    pub note: Option<String>,
    /// What the bars' error bars show (min..max of repeats, a run's bootstrap interval);
    /// None where no bar has one, and for lines.
    pub error_bars: Option<String>,
}
