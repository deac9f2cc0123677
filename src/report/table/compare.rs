//! `--compare BASE…`: the runs of `-i` against a baseline group of runs (an earlier binary, an
//! earlier session), configuration by configuration: the ratio of their throughput with a 95 %
//! interval, and whether the interval leaves 1 (a real change) or not (within the noise).
//!
//! A configuration is the model, suite, mode, dtype, engine, GPU, fused paths, batch size, tp /
//! dp / ZeRO, sequence length and passage count; repeats of one configuration are folded to their median.
//! The interval of new / base is [new low / base high, new high / base low] from each side's
//! interval: the bootstrap interval a run logs (`samples_per_second_ci95_low/high`), or, for
//! repeats, the range of the repeats. Runs with neither (one old run) get no interval.

use super::{Col, Fmt};
use crate::error::{Error, Result};
use crate::record::RunStatus;
use crate::report::row::{polars_err, RunRow};
use polars::prelude::*;
use std::collections::BTreeMap;

const TEXT_KEY: &[&str] = &["model", "suite", "mode", "dtype", "engine", "gpu", "fused"];
const NUM_KEY: &[&str] = &["batch_size", "tp", "dp", "zero", "seq_len", "n_samples"];

/// A 95 % interval (low, high), where known.
type Interval = Option<(f64, f64)>;
/// A run with its throughput and interval.
type Measured<'a> = (&'a RunRow, f64, Interval);

/// One side's throughput for a configuration: median, and a 95 % interval where known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Side {
    pub median: f64,
    pub interval: Interval,
}

/// The throughput a run is compared by, with its logged interval where it has one.
fn throughput(r: &RunRow) -> Option<(f64, Interval)> {
    let (name, v) = ["samples_per_second", "train_samples_per_second"]
        .iter()
        .find_map(|k| r.num(k).map(|v| (*k, v)))?;
    let ci = r
        .num(&format!("{name}_ci95_low"))
        .zip(r.num(&format!("{name}_ci95_high")));
    Some((v, ci))
}

fn key(r: &RunRow) -> String {
    let text = TEXT_KEY
        .iter()
        .map(|k| r.meta.get(*k).map_or("-", String::as_str).to_string());
    let nums = NUM_KEY
        .iter()
        .map(|k| r.num(k).map_or("-".into(), |v| format!("{v}")));
    text.chain(nums).collect::<Vec<_>>().join("|")
}

/// Each configuration's side: finished runs only, repeats folded.
pub fn sides(rows: &[RunRow]) -> BTreeMap<String, (Side, &RunRow)> {
    let mut by: BTreeMap<String, Vec<Measured>> = BTreeMap::new();
    for r in rows {
        let ok = r
            .meta
            .get("status")
            .is_none_or(|s| s == RunStatus::Ok.as_str());
        if let (true, Some((v, ci))) = (ok, throughput(r)) {
            by.entry(key(r)).or_default().push((r, v, ci));
        }
    }
    by.into_iter()
        .map(|(k, runs)| {
            let mut vals: Vec<f64> = runs.iter().map(|x| x.1).collect();
            vals.sort_by(f64::total_cmp);
            let median = vals[vals.len() / 2];
            let interval = match runs.len() {
                1 => runs[0].2,
                _ => Some((vals[0], vals[vals.len() - 1])),
            };
            (k, (Side { median, interval }, runs[0].0))
        })
        .collect()
}

/// new / base, its interval, and the word for it.
#[derive(Clone, Copy, Debug)]
pub struct Verdict {
    pub ratio: f64,
    pub interval: Interval,
    /// `faster`, `slower` (the interval leaves 1), `within noise`, or `no interval`.
    pub word: &'static str,
}

/// new / base, its interval, and the verdict.
pub fn verdict(new: Side, base: Side) -> Verdict {
    let interval = new
        .interval
        .zip(base.interval)
        .map(|((nl, nh), (bl, bh))| (nl / bh, nh / bl));
    let word = match interval {
        None => "no interval",
        Some((lo, _)) if lo > 1. => "faster",
        Some((_, hi)) if hi < 1. => "slower",
        Some(_) => "within noise",
    };
    Verdict {
        ratio: new.median / base.median,
        interval,
        word,
    }
}

/// The comparison table of `rows` (new) against `base`, and its Markdown columns.
pub fn compare_table(rows: &[RunRow], base: &[RunRow]) -> Result<(DataFrame, Vec<Col>)> {
    let (new, old) = (sides(rows), sides(base));
    let both: Vec<(&String, &(Side, &RunRow))> =
        new.iter().filter(|(k, _)| old.contains_key(*k)).collect();
    if both.is_empty() {
        return Err(Error::Config(
            "--compare: no configuration (model, suite, mode, dtype, engine, GPU, batch, tp/dp/ZeRO, passages) is in both groups of runs".into(),
        ));
    }
    let text = |k: &str| -> Vec<Option<String>> {
        both.iter()
            .map(|(_, (_, r))| r.meta.get(k).cloned())
            .collect()
    };
    let mut columns = vec![];
    let mut cols = vec![];
    for k in ["model", "suite", "mode", "dtype", "engine"] {
        columns.push(Column::new(k.into(), text(k)));
        cols.push(Col::new(k, k, Fmt::Auto));
    }
    let batch: Vec<Option<i64>> = both
        .iter()
        .map(|(_, (_, r))| r.num("batch_size").map(|v| v as i64))
        .collect();
    columns.push(Column::new("batch_size".into(), batch));
    cols.push(Col::new("batch_size", "batch", Fmt::Auto));
    for k in ["tp", "dp"] {
        let v: Vec<Option<i64>> = both
            .iter()
            .map(|(_, (_, r))| r.num(k).map(|v| v as i64))
            .collect();
        if v.iter().any(|x| x.is_some_and(|n| n > 1)) {
            columns.push(Column::new(k.into(), v));
            cols.push(Col::new(k, k, Fmt::Auto));
        }
    }
    // (base, new, verdict) a configuration.
    let rows3: Vec<(Side, Side, Verdict)> = both
        .iter()
        .map(|(k, (n, _))| (old[*k].0, *n, verdict(*n, old[*k].0)))
        .collect();
    let num = |f: fn(&(Side, Side, Verdict)) -> Option<f64>| -> Vec<Option<f64>> {
        rows3.iter().map(f).collect()
    };
    let measures: [(&str, &str, Vec<Option<f64>>); 5] = [
        (
            "base_samples_per_second",
            "base samples/s",
            num(|x| Some(x.0.median)),
        ),
        ("samples_per_second", "samples/s", num(|x| Some(x.1.median))),
        ("ratio", "ratio", num(|x| Some(x.2.ratio))),
        (
            "ratio_ci95_low",
            "95 % low",
            num(|x| x.2.interval.map(|i| i.0)),
        ),
        (
            "ratio_ci95_high",
            "95 % high",
            num(|x| x.2.interval.map(|i| i.1)),
        ),
    ];
    for (name, label, v) in measures {
        columns.push(Column::new(name.into(), v));
        let fmt = if name.starts_with("ratio") {
            Fmt::Fixed(3)
        } else {
            Fmt::Fixed(1)
        };
        cols.push(Col::new(name, label, fmt));
    }
    let words: Vec<&str> = rows3.iter().map(|x| x.2.word).collect();
    columns.push(Column::new("change".into(), words));
    cols.push(Col::new("change", "change", Fmt::Auto));
    let df = DataFrame::new(both.len(), columns).map_err(polars_err)?;
    Ok((df, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(median: f64, interval: Option<(f64, f64)>) -> Side {
        Side { median, interval }
    }

    /// A ratio is significant only when its whole interval is on one side of 1.
    #[test]
    fn the_verdict_follows_the_interval() {
        let base = side(100., Some((98., 102.)));
        let v = verdict(side(110., Some((108., 112.))), base);
        assert!((v.ratio - 1.1).abs() < 1e-12);
        assert_eq!(v.word, "faster");
        let (lo, hi) = v.interval.unwrap();
        assert!((lo - 108. / 102.).abs() < 1e-12 && (hi - 112. / 98.).abs() < 1e-12);
        assert_eq!(verdict(side(90., Some((88., 92.))), base).word, "slower");
        assert_eq!(
            verdict(side(101., Some((97., 105.))), base).word,
            "within noise"
        );
        assert_eq!(verdict(side(101., None), base).word, "no interval");
    }
}
