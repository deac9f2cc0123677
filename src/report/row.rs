//! The rows every report is made of, below both the log parsers ([`super::extract`]) and the
//! tables ([`super::table`]): one run's metadata and numeric metrics, the polars helpers they
//! share, and reading a (gzipped) log.

use crate::error::{Error, Result};
use polars::prelude::{DataFrame, PolarsError};
use std::collections::BTreeMap;
use std::path::Path;

/// A metric's value. Integer quantities (sizes, counts, bytes) stay integers, so the CSV says
/// `8`, not `8.0`; a column is written as integers when every run's value in it is one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    /// A JSON number as it was written: `8` an integer, `8.0` a float.
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        v.as_i64()
            .map(Num::Int)
            .or_else(|| v.as_f64().map(Num::Float))
    }
}

impl From<usize> for Num {
    fn from(v: usize) -> Self {
        Num::Int(v as i64)
    }
}

impl From<u64> for Num {
    fn from(v: u64) -> Self {
        Num::Int(v as i64)
    }
}

impl From<f64> for Num {
    fn from(v: f64) -> Self {
        Num::Float(v)
    }
}

/// One run's row before it becomes a table row.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRow {
    pub meta: BTreeMap<String, String>,
    pub metrics: BTreeMap<String, Num>,
}

impl RunRow {
    /// Sets a metric.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Num>) {
        self.metrics.insert(key.into(), value.into());
    }

    /// A metric as f64.
    pub fn num(&self, key: &str) -> Option<f64> {
        self.metrics.get(key).map(|v| v.as_f64())
    }

    /// A column's cell as text (metadata as is, metrics as numbers), None when empty.
    pub fn cell(&self, key: &str) -> Option<String> {
        if let Some(v) = self.meta.get(key) {
            return Some(v.clone());
        }
        self.metrics.get(key).map(|v| match v {
            Num::Int(i) => i.to_string(),
            Num::Float(f) => f.to_string(),
        })
    }

    /// Whether the row has the column at all.
    pub fn has(&self, key: &str) -> bool {
        self.meta.contains_key(key) || self.metrics.contains_key(key)
    }
}

/// HF transformers in any configuration (`hf`, `hf-compile`, `hf-trainer`): the engine the
/// others' ratios are over.
pub fn is_hf(engine: &str) -> bool {
    engine.starts_with("hf")
}

pub fn column_names(df: &DataFrame) -> String {
    df.get_column_names()
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn polars_err(e: PolarsError) -> Error {
    Error::Config(format!("table error: {e}"))
}

pub fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// A file's bytes, gunzipped if its name ends in `.gz`.
pub fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if !is_gz(path) {
        return Ok(bytes);
    }
    gunzip(&bytes, path)
}

/// The gunzipped `bytes` of the file `path` names (for the error message).
pub fn gunzip(bytes: &[u8], path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut out = vec![];
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| Error::io(format!("gunzipping {}", path.display()), e))?;
    Ok(out)
}
