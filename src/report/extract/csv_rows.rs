//! An extract-metrics CSV read back as rows, so a committed CSV can be filtered, tabled and
//! combined as its logs were (`extract-metrics -i results/current/h100.csv --markdown`).
//!
//! A text (or true/false) column is metadata, a numeric one a metric: integer columns stay
//! integers, float columns floats, as the CSV writer wrote them. Cells that are empty are
//! absent. The `file` and `format` cells are kept, so a row still names the log it came from
//! (and its call, which the derived ratios pair by).

use crate::report::row::{Num, RunRow};
use polars::prelude::*;
use std::io::Cursor;

/// The rows of the CSV `text`, over `row`'s metadata; None when it is no CSV with a header.
pub(super) fn parse(row: &RunRow, text: &str) -> Option<Vec<RunRow>> {
    let df = CsvReadOptions::default()
        .with_has_header(true)
        // Every row decides a column's type: an integer column with one float is floats.
        .with_infer_schema_length(None)
        .into_reader_with_file_handle(Cursor::new(text.as_bytes()))
        .finish()
        .ok()?;
    let mut rows = vec![row.clone(); df.height()];
    for c in df.columns() {
        let name = c.name().to_string();
        if c.dtype().is_integer() {
            let v = c.cast(&DataType::Int64).ok()?;
            for (r, x) in rows.iter_mut().zip(v.i64().ok()?.iter()) {
                if let Some(x) = x {
                    r.set(&name, Num::Int(x));
                }
            }
        } else if c.dtype().is_float() {
            let v = c.cast(&DataType::Float64).ok()?;
            for (r, x) in rows.iter_mut().zip(v.f64().ok()?.iter()) {
                if let Some(x) = x {
                    r.set(&name, Num::Float(x));
                }
            }
        } else {
            let v = c.cast(&DataType::String).ok()?;
            for (r, x) in rows.iter_mut().zip(v.str().ok()?.iter()) {
                if let Some(x) = x {
                    r.meta.insert(name.clone(), x.to_string());
                }
            }
        }
    }
    Some(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn text_is_metadata_numbers_are_metrics_and_empty_cells_are_absent() {
        let csv = "run,file,engine,hf_compile,batch_size,samples_per_second\n\
                   a,logs/a.jsonl,candle,,16,10.0\n\
                   b,logs/b.jsonl,hf,true,1,\n";
        // The row `formats` would start from (built here: the dispatch imports this file).
        let base = RunRow {
            meta: BTreeMap::from([
                ("file".to_string(), "x.csv".to_string()),
                ("format".to_string(), "extract-csv".to_string()),
            ]),
            metrics: BTreeMap::new(),
        };
        let rows = parse(&base, csv).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].meta["file"], "logs/a.jsonl");
        assert_eq!(rows[0].metrics["batch_size"], Num::Int(16));
        assert_eq!(rows[0].metrics["samples_per_second"], Num::Float(10.0));
        assert!(!rows[0].meta.contains_key("hf_compile"));
        assert_eq!(rows[1].meta["hf_compile"], "true");
        assert!(!rows[1].metrics.contains_key("samples_per_second"));
    }
}
