//! Rows -> polars frames: wide (one row per run), long (tidy), grouped (repeats folded), and
//! the CSV bytes of a frame.

use super::schema;
use crate::error::{Error, Result};
use crate::report::row::{column_names, polars_err};
use crate::report::row::{Num, RunRow};
use polars::prelude::*;
use std::collections::BTreeSet;

/// One row per run: metadata (string) columns, then metric columns, sorted by name; a metric
/// column is Int64 when every value in it is an integer, else Float64.
pub fn wide_frame(rows: &[RunRow]) -> Result<DataFrame> {
    let metas: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.meta.keys().map(String::as_str))
        .collect();
    let metrics: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.metrics.keys().map(String::as_str))
        .collect();
    let mut cols: Vec<Column> = vec![];
    let ordered = schema::META
        .iter()
        .copied()
        .filter(|m| metas.contains(m))
        .chain(metas.iter().copied().filter(|m| !schema::META.contains(m)));
    for m in ordered {
        let v: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.meta.get(m).map(String::as_str))
            .collect();
        cols.push(Column::new(m.into(), v));
    }
    for m in metrics {
        let values: Vec<Option<Num>> = rows.iter().map(|r| r.metrics.get(m).copied()).collect();
        cols.push(number_column(m, &values));
    }
    DataFrame::new(rows.len(), cols).map_err(polars_err)
}

/// A metric column: integers when every present value is one.
fn number_column(name: &str, values: &[Option<Num>]) -> Column {
    let all_int = values.iter().flatten().all(|v| matches!(v, Num::Int(_)));
    if all_int {
        let v: Vec<Option<i64>> = values
            .iter()
            .map(|v| match v {
                Some(Num::Int(i)) => Some(*i),
                _ => None,
            })
            .collect();
        Column::new(name.into(), v)
    } else {
        let v: Vec<Option<f64>> = values.iter().map(|v| v.map(Num::as_f64)).collect();
        Column::new(name.into(), v)
    }
}

/// Tidy rows: run, file, format, metric, value. `value` holds integers and floats in one
/// column, each written as itself (`3`, `10.0`, `0.0000429`).
pub fn long_frame(rows: &[RunRow]) -> Result<DataFrame> {
    let (mut run, mut file, mut format, mut metric, mut value) =
        (vec![], vec![], vec![], vec![], vec![]);
    for r in rows {
        for (k, v) in &r.metrics {
            run.push(r.meta["run"].clone());
            file.push(r.meta["file"].clone());
            format.push(r.meta["format"].clone());
            metric.push(k.clone());
            value.push(match v {
                Num::Int(i) => i.to_string(),
                Num::Float(f) => float_text(*f),
            });
        }
    }
    let height = run.len();
    DataFrame::new(
        height,
        vec![
            Column::new("run".into(), run),
            Column::new("file".into(), file),
            Column::new("format".into(), format),
            Column::new("metric".into(), metric),
            Column::new("value".into(), value),
        ],
    )
    .map_err(polars_err)
}

/// A float as the CSV writer writes it: never in exponent form, `10.0` for integral values.
fn float_text(f: f64) -> String {
    let s = f.to_string();
    if f.is_finite() && !s.contains('.') {
        s + ".0"
    } else {
        s
    }
}

/// Repeats folded: per group, every metric's median (its own name), `_min`, `_max`; `count` rows.
pub fn grouped_frame(df: DataFrame, by: &[String]) -> Result<DataFrame> {
    for c in by {
        if df.column(c).is_err() {
            return Err(Error::Config(format!(
                "--group-by: no column '{c}' (columns: {})",
                column_names(&df)
            )));
        }
    }
    let metrics: Vec<String> = df
        .columns()
        .iter()
        .filter(|c| c.dtype().is_primitive_numeric() && !by.contains(&c.name().to_string()))
        .map(|c| c.name().to_string())
        .collect();
    let mut aggs = vec![len().alias("count")];
    for m in &metrics {
        aggs.push(col(m.as_str()).median().alias(m.as_str()));
        aggs.push(col(m.as_str()).min().alias(format!("{m}_min")));
        aggs.push(col(m.as_str()).max().alias(format!("{m}_max")));
    }
    let keys: Vec<Expr> = by.iter().map(|c| col(c.as_str())).collect();
    df.lazy()
        .group_by_stable(keys)
        .agg(aggs)
        .collect()
        .map_err(polars_err)
}

/// CSV bytes of a frame.
pub fn to_csv(df: &mut DataFrame) -> Result<Vec<u8>> {
    let mut buf = vec![];
    CsvWriter::new(&mut buf).finish(df).map_err(polars_err)?;
    Ok(buf)
}
