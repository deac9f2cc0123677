//! Which rows are plotted: the filter flags, each a test on one column. When nothing is left
//! the error names the filter that matched nothing and the values its column holds.

use super::args::Args;
use crate::error::{Error, Result};
use crate::report::filter::Where;
use crate::report::row::{column_names, polars_err};
use polars::prelude::*;

/// A column's cells as text (None when empty or when there is no such column).
pub fn text_column(df: &DataFrame, name: &str) -> Result<Vec<Option<String>>> {
    let Ok(c) = df.column(name) else {
        return Ok(vec![None; df.height()]);
    };
    let c = c.cast(&DataType::String).map_err(polars_err)?;
    Ok(c.str()
        .map_err(polars_err)?
        .iter()
        .map(|v| v.map(str::to_string))
        .collect())
}

/// A column's cells as numbers (None where a cell is empty or no number).
pub fn number_column(df: &DataFrame, name: &str) -> Result<Option<Vec<Option<f64>>>> {
    let Ok(c) = df.column(name) else {
        return Ok(None);
    };
    let c = c.cast(&DataType::Float64).map_err(polars_err)?;
    Ok(Some(c.f64().map_err(polars_err)?.iter().collect()))
}

type Test = Box<dyn Fn(Option<&str>) -> bool>;

/// One filter flag: how it was written, the column it reads, the test.
struct Filter {
    flag: String,
    column: String,
    test: Test,
}

fn filters(df: &DataFrame, args: &Args) -> Result<Vec<Filter>> {
    let mut out = vec![];
    let mut add = |flag: String, column: &str, test: Test| {
        out.push(Filter {
            flag,
            column: column.into(),
            test,
        })
    };
    let precisions = args.precisions();
    if !precisions.is_empty() {
        let flags: Vec<String> = precisions.iter().map(|p| format!("--{p}")).collect();
        let test = move |d: Option<&str>| d.is_some_and(|d| precisions.contains(&d));
        add(flags.join(" "), "dtype", Box::new(test));
    }
    for (col, want) in [
        ("model", &args.model),
        ("suite", &args.suite),
        ("engine", &args.engine),
    ] {
        if let Some(w) = want.clone() {
            let flag = format!("--{col} {w}");
            add(flag, col, Box::new(move |v| v == Some(w.as_str())));
        }
    }
    if let Some(g) = args.gpu.clone() {
        let test = move |v: Option<&str>| v.is_some_and(|v| v.contains(g.as_str()));
        add(
            format!("--gpu {}", args.gpu.as_deref().unwrap_or("")),
            "gpu",
            Box::new(test),
        );
    }
    if let Some(b) = args.batch_size {
        let test = move |v: Option<&str>| v.and_then(|v| v.parse::<f64>().ok()) == Some(b);
        add(format!("--batch-size {b}"), "batch_size", Box::new(test));
    }
    for w in Where::parse_all(&args.filters)? {
        if df.column(&w.key).is_err() {
            return Err(Error::Config(format!(
                "--where {}: no column '{}' (columns: {})",
                w.text(),
                w.key,
                column_names(df)
            )));
        }
        let (flag, key) = (format!("--where {}", w.text()), w.key.clone());
        add(flag, &key, Box::new(move |v| w.matches(v)));
    }
    Ok(out)
}

/// Indices of the rows that pass every filter and have a value of the metric; an error that
/// says which filter left nothing when none does.
pub fn kept_rows(df: &DataFrame, args: &Args, value: &[Option<f64>]) -> Result<Vec<usize>> {
    let filters = filters(df, args)?;
    let mut cols = vec![];
    for f in &filters {
        cols.push(text_column(df, &f.column)?);
    }
    let passes = |f: usize, i: usize| (filters[f].test)(cols[f][i].as_deref());
    let rows: Vec<usize> = (0..df.height())
        .filter(|&i| value[i].is_some() && (0..filters.len()).all(|f| passes(f, i)))
        .collect();
    if !rows.is_empty() {
        return Ok(rows);
    }
    let csv = args.input.display();
    for (f, filter) in filters.iter().enumerate() {
        if !(0..df.height()).any(|i| passes(f, i)) {
            return Err(Error::Config(format!(
                "no rows of {csv} match {} ({} holds: {})",
                filter.flag,
                filter.column,
                distinct(&cols[f])
            )));
        }
    }
    Err(Error::Config(format!(
        "no rows of {csv} match the filters together with a value of {}",
        args.metric
    )))
}

/// A column's distinct values, the first 10, for an error message.
fn distinct(col: &[Option<String>]) -> String {
    let mut seen: Vec<&str> = vec![];
    for v in col.iter().flatten() {
        if !seen.contains(&v.as_str()) {
            seen.push(v);
        }
    }
    let more = seen.len().saturating_sub(10);
    seen.truncate(10);
    let mut s = seen.join(", ");
    if more > 0 {
        s += &format!(" and {more} more");
    }
    if s.is_empty() {
        "nothing".into()
    } else {
        s
    }
}
