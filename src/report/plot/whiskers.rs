//! What a bar's error bar shows. A bar of several rows (repeats: `--repeat N` runs, or runs
//! of one configuration logged apart) is their median, its error bar the min..max of them, and
//! of the `_min` / `_max` columns of rows that fold repeats already (`extract-metrics
//! --group-by`). A bar of one run is its value, its error bar the run's 95 % bootstrap interval
//! over its timed batches (`_ci95_low` / `_high`, where the CSV has them), else its `_min` /
//! `_max`. The interval of one run says how far its batches scatter, the range of repeats how
//! far whole runs do (clocks, other tenants): the chart's note says which it drew.

use super::chart::Point;
use super::select::number_column;
use crate::error::Result;
use polars::prelude::*;

/// Where a row's own error bar comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Whisker {
    /// None: the bar's value alone.
    None,
    /// `_min` / `_max`: the range of the repeats the row folds.
    Range,
    /// `_ci95_low` / `_high`: the run's bootstrap interval.
    Interval,
}

/// One CSV row's value with its own error bar (scaled to the axis' units).
#[derive(Clone, Copy, Debug)]
pub(super) struct RowPoint {
    pub point: Point,
    pub whisker: Whisker,
}

/// A numeric column, where the CSV has it.
type Column = Option<Vec<Option<f64>>>;

/// The metric's bound columns (low, high).
pub(super) struct Bounds {
    range: (Column, Column),
    interval: (Column, Column),
}

impl Bounds {
    pub fn read(df: &DataFrame, metric: &str) -> Result<Self> {
        let col = |suffix: &str| number_column(df, &format!("{metric}_{suffix}"));
        Ok(Self {
            range: (col("min")?, col("max")?),
            interval: (col("ci95_low")?, col("ci95_high")?),
        })
    }

    /// Row `i` of value `v`, every figure times `scale`.
    pub fn row(&self, i: usize, v: f64, scale: f64) -> RowPoint {
        let at = |c: &Column| c.as_ref().and_then(|c| c[i]);
        let pair = |(lo, hi): &(_, _)| at(lo).zip(at(hi));
        let (whisker, (lo, hi)) = match (pair(&self.range), pair(&self.interval)) {
            (Some(r), _) => (Whisker::Range, r),
            (None, Some(ci)) => (Whisker::Interval, ci),
            (None, None) => (Whisker::None, (v, v)),
        };
        RowPoint {
            point: Point {
                value: v * scale,
                lo: lo.min(v) * scale,
                hi: hi.max(v) * scale,
            },
            whisker,
        }
    }
}

/// A bar's rows folded: one row keeps its own error bar; several give their median and the
/// min..max of their values (and of their `_min` / `_max`), not of their intervals. The kind
/// of error bar drawn comes back with it.
pub(super) fn fold(rows: &[RowPoint]) -> (Point, Whisker) {
    if let [one] = rows {
        return (one.point, one.whisker);
    }
    let mut vals: Vec<f64> = rows.iter().map(|r| r.point.value).collect();
    vals.sort_by(f64::total_cmp);
    let bound = |r: &RowPoint, lo: bool| match (r.whisker, lo) {
        (Whisker::Range, true) => r.point.lo,
        (Whisker::Range, false) => r.point.hi,
        _ => r.point.value,
    };
    let point = Point {
        value: crate::metrics::percentile(&vals, 50.),
        lo: rows
            .iter()
            .map(|r| bound(r, true))
            .fold(f64::INFINITY, f64::min),
        hi: rows
            .iter()
            .map(|r| bound(r, false))
            .fold(f64::NEG_INFINITY, f64::max),
    };
    (point, Whisker::Range)
}

/// The note that says what the drawn error bars are: `kinds` of the bars whose error bar has
/// a length. None where no bar has one.
pub(super) fn note(kinds: &[Whisker]) -> Option<String> {
    let range = kinds.contains(&Whisker::Range);
    let interval = kinds.contains(&Whisker::Interval);
    match (range, interval) {
        (true, true) => {
            Some("error bars: min–max of repeats; one run: its 95 % bootstrap interval".into())
        }
        (true, false) => Some("error bars: min–max of repeats".into()),
        (false, true) => Some("error bars: 95 % bootstrap interval of each run's batches".into()),
        (false, false) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(value: f64, lo: f64, hi: f64, whisker: Whisker) -> RowPoint {
        let point = Point { value, lo, hi };
        RowPoint { point, whisker }
    }

    #[test]
    fn one_run_keeps_its_interval_repeats_give_their_range() {
        let run = row(100., 95., 104., Whisker::Interval);
        assert_eq!(fold(&[run]), (run.point, Whisker::Interval));
        // Repeats: their values' range, not their intervals'; a folded row's range counts.
        let repeats = [
            run,
            row(110., 101., 118., Whisker::Interval),
            row(90., 80., 97., Whisker::Range),
        ];
        let (p, w) = fold(&repeats);
        assert_eq!((p.value, p.lo, p.hi, w), (100., 80., 110., Whisker::Range));
    }

    #[test]
    fn the_note_names_what_was_drawn() {
        assert_eq!(note(&[Whisker::None]), None);
        let both = note(&[Whisker::Range, Whisker::Interval]).unwrap();
        assert!(both.contains("min–max of repeats") && both.contains("bootstrap"));
    }
}
