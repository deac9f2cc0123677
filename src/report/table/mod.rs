//! Tables for people: a frame (or rows of text) -> Markdown, each column with its own number
//! format (`--columns NAME[:FMT][=LABEL]`), and the report tables built on it:
//! [`ratio`] (two engines side by side), [`dp`] and [`tp`] (parallel runs against their
//! single-GPU run, from the logs' step and passage records, [`logs`]; `--table`'s choice of
//! them in [`parallel`]).

pub mod compare;
pub mod defaults;
pub mod dp;
pub mod logs;
pub mod parallel;
pub mod ratio;
pub mod tp;

pub use parallel::{report, TableKind};

use crate::error::{Error, Result};
use crate::report::row::{column_names, polars_err};
use polars::prelude::*;
use std::cmp::Ordering;

/// How a number is written in a Markdown cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fmt {
    /// Integers as they are; other numbers to 4 significant digits, trailing zeros dropped.
    Auto,
    /// N decimals.
    Fixed(usize),
    /// Scientific with N decimals, written as Python's `%.Ne` (`9.802e+06`).
    Sci(usize),
    /// A fraction as percent with N decimals (0.196 -> `19.6%`).
    Percent(usize),
    /// Bytes divided by the unit, N decimals.
    Bytes(f64, usize),
}

impl Fmt {
    /// `.N`, `eN`, `%N`, `GiB.N`, `MiB.N`, `GB.N`, `MB.N`, or empty for [`Fmt::Auto`].
    pub fn parse(s: &str) -> Option<Self> {
        let n = |d: &str| d.parse::<usize>().ok().filter(|n| *n <= 12);
        if s.is_empty() {
            return Some(Fmt::Auto);
        }
        if let Some(d) = s.strip_prefix('.') {
            return n(d).map(Fmt::Fixed);
        }
        if let Some(d) = s.strip_prefix('e') {
            return n(d).map(Fmt::Sci);
        }
        if let Some(d) = s.strip_prefix('%') {
            return n(d).map(Fmt::Percent);
        }
        let (unit, d) = s.split_once('.')?;
        let div = match unit {
            "GiB" => (1u64 << 30) as f64,
            "MiB" => (1u64 << 20) as f64,
            "GB" => 1e9,
            "MB" => 1e6,
            _ => return None,
        };
        n(d).map(|d| Fmt::Bytes(div, d))
    }

    /// `v` written in this format; NaN and infinities as Python writes them.
    pub fn write(self, v: f64) -> String {
        if v.is_nan() {
            return "nan".into();
        }
        if v.is_infinite() {
            return if v > 0. { "inf" } else { "-inf" }.into();
        }
        match self {
            Fmt::Auto => auto(v),
            Fmt::Fixed(d) => format!("{v:.d$}"),
            Fmt::Sci(d) => sci(v, d),
            Fmt::Percent(d) => format!("{:.d$}%", v * 100.),
            Fmt::Bytes(div, d) => format!("{:.d$}", v / div),
        }
    }
}

/// 4 significant digits, trailing zeros dropped: 2820.2 -> 2820, 7.27 -> 7.27, 0 -> 0.
fn auto(v: f64) -> String {
    if v == 0. {
        return "0".into();
    }
    let mag = v.abs().log10().floor() as i32;
    if !(-4..9).contains(&mag) {
        return sci(v, 3);
    }
    let d = (3 - mag).max(0) as usize;
    trim_zeros(format!("{v:.d$}"))
}

/// "12.500" -> "12.5", "3.000" -> "3"; text without a '.' as it is.
pub fn trim_zeros(s: String) -> String {
    if !s.contains('.') {
        return s;
    }
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Python's `%.{d}e`: mantissa, `e`, sign, at least two exponent digits.
pub fn sci(v: f64, d: usize) -> String {
    let s = format!("{v:.d$e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mant}e{sign}{:02}", exp.abs())
}

/// A column of a Markdown table: which frame column, its header, its number format.
#[derive(Clone, Debug, PartialEq)]
pub struct Col {
    pub name: String,
    pub label: String,
    pub fmt: Fmt,
    /// Bold cells (the headline column of a ratio table).
    pub bold: bool,
}

impl Col {
    pub fn new(name: &str, label: &str, fmt: Fmt) -> Self {
        Self {
            name: name.into(),
            label: label.into(),
            fmt,
            bold: false,
        }
    }

    /// `NAME[:FMT][=LABEL]`, as `--columns` takes it.
    pub fn parse(spec: &str) -> Result<Self> {
        let (head, label) = match spec.split_once('=') {
            Some((h, l)) => (h, Some(l)),
            None => (spec, None),
        };
        let (name, fmt) = head.split_once(':').unwrap_or((head, ""));
        let Some(f) = Fmt::parse(fmt) else {
            return Err(Error::Config(format!(
                "--columns {spec}: unknown format '{fmt}' (use .N, eN, %N, GiB.N, MiB.N, GB.N or MB.N)"
            )));
        };
        if name.trim().is_empty() {
            return Err(Error::Config(format!(
                "--columns {spec}: no column name (NAME[:FMT][=LABEL])"
            )));
        }
        let name = name.trim();
        Ok(Self::new(name, label.unwrap_or(name), f))
    }

    /// Every column of a frame, under its own name, numbers in [`Fmt::Auto`].
    pub fn all(df: &DataFrame) -> Vec<Self> {
        df.get_column_names()
            .iter()
            .map(|n| Self::new(n.as_str(), n.as_str(), Fmt::Auto))
            .collect()
    }

    pub fn bold(mut self) -> Self {
        self.bold = true;
        self
    }
}

/// The frame's columns named by `cols`, in that order; a missing one is an error listing them.
pub fn select(df: &DataFrame, cols: &[Col]) -> Result<DataFrame> {
    for c in cols {
        if df.column(&c.name).is_err() {
            return Err(Error::Config(format!(
                "--columns: no column '{}' (columns: {})",
                c.name,
                column_names(df)
            )));
        }
    }
    df.select(cols.iter().map(|c| c.name.as_str()))
        .map_err(polars_err)
}

/// The cells of one frame column as text.
fn cells(df: &DataFrame, c: &Col) -> Result<Vec<String>> {
    let col = df.column(&c.name).map_err(polars_err)?;
    let wrap = |s: String| {
        if c.bold && !s.is_empty() {
            format!("**{s}**")
        } else {
            s
        }
    };
    let out: Vec<String> = if col.dtype().is_primitive_numeric() {
        let is_int = col.dtype().is_integer();
        let f = col.cast(&DataType::Float64).map_err(polars_err)?;
        f.f64()
            .map_err(polars_err)?
            .iter()
            .map(|v| match v {
                None => String::new(),
                Some(v) if is_int && c.fmt == Fmt::Auto => format!("{}", v as i64),
                Some(v) => c.fmt.write(v),
            })
            .map(wrap)
            .collect()
    } else {
        let s = col.cast(&DataType::String).map_err(polars_err)?;
        s.str()
            .map_err(polars_err)?
            .iter()
            .map(|v| wrap(v.unwrap_or("").to_string()))
            .collect()
    };
    Ok(out)
}

/// A frame as a Markdown table, `cols` in order.
pub fn markdown(df: &DataFrame, cols: &[Col]) -> Result<String> {
    let columns: Vec<Vec<String>> = cols.iter().map(|c| cells(df, c)).collect::<Result<_>>()?;
    let rows: Vec<Vec<String>> = (0..df.height())
        .map(|i| columns.iter().map(|c| c[i].clone()).collect())
        .collect();
    let labels: Vec<&str> = cols.iter().map(|c| c.label.as_str()).collect();
    Ok(md_rows(&labels, &rows))
}

/// Header, separator and rows of a Markdown table (`|` in cells escaped).
pub fn md_rows(headers: &[&str], rows: &[Vec<String>]) -> String {
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out += &format!("|{}\n", "---|".repeat(headers.len()));
    for r in rows {
        out += &line(r.iter().map(|c| c.replace('|', "\\|")).collect());
    }
    out
}

/// Rank of a precision in tables: fp32, tf32, bf16, fp16, then the rest.
pub fn precision_rank(dtype: &str) -> usize {
    ["fp32", "tf32", "bf16", "fp16"]
        .iter()
        .position(|p| *p == dtype)
        .unwrap_or(4)
}

/// Order of two cells of column `col`: empty last, dtype by precision, numbers as numbers.
pub fn compare_cells(col: &str, a: Option<&str>, b: Option<&str>) -> Ordering {
    let (a, b) = match (a, b) {
        (None, None) => return Ordering::Equal,
        (None, _) => return Ordering::Greater,
        (_, None) => return Ordering::Less,
        (Some(a), Some(b)) => (a, b),
    };
    if col == "dtype" {
        let o = precision_rank(a).cmp(&precision_rank(b));
        if o.is_ne() {
            return o;
        }
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        _ => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_write_like_the_python_scripts_did() {
        assert_eq!(Fmt::parse(".2").unwrap().write(40.0629), "40.06");
        assert_eq!(Fmt::parse("e1").unwrap().write(5.2e-8), "5.2e-08");
        assert_eq!(Fmt::parse("e3").unwrap().write(9_802_000.), "9.802e+06");
        assert_eq!(Fmt::parse("%1").unwrap().write(0.1963), "19.6%");
        assert_eq!(Fmt::parse("GiB.2").unwrap().write(2_587_885_568.), "2.41");
        assert_eq!(Fmt::parse("MiB.0").unwrap().write(2_587_885_568.), "2468");
        assert_eq!(Fmt::parse(".3").unwrap().write(f64::NAN), "nan");
        assert_eq!(Fmt::Auto.write(2820.24), "2820");
        assert_eq!(Fmt::Auto.write(7.2700001), "7.27");
        assert_eq!(Fmt::Auto.write(0.), "0");
        assert_eq!(Fmt::Auto.write(1.2e-7), "1.200e-07");
        assert!(Fmt::parse("x2").is_none() && Fmt::parse("GiB").is_none());
    }

    #[test]
    fn column_specs_parse_and_bad_ones_say_the_syntax() {
        let c = Col::parse("samples_per_second:.1=samples/s").unwrap();
        assert_eq!(
            (c.name.as_str(), c.label.as_str(), c.fmt),
            ("samples_per_second", "samples/s", Fmt::Fixed(1))
        );
        assert_eq!(Col::parse("model").unwrap().label, "model");
        let err = Col::parse("x:zz").unwrap_err().to_string();
        assert!(err.contains("unknown format 'zz'"), "{err}");
    }

    #[test]
    fn markdown_formats_each_column() {
        let df = df!(
            "model" => ["gpt2", "bloom"],
            "batch_size" => [16i64, 1],
            "v" => [Some(1.23456), None],
        )
        .unwrap();
        let cols = vec![
            Col::new("model", "model", Fmt::Auto),
            Col::new("batch_size", "batch", Fmt::Auto),
            Col::new("v", "v", Fmt::Fixed(2)).bold(),
        ];
        assert_eq!(
            markdown(&df, &cols).unwrap(),
            "| model | batch | v |\n|---|---|---|\n| gpt2 | 16 | **1.23** |\n| bloom | 1 |  |\n"
        );
    }

    #[test]
    fn dtype_sorts_by_precision_and_numbers_as_numbers() {
        assert!(compare_cells("dtype", Some("fp32"), Some("bf16")).is_lt());
        assert!(compare_cells("batch_size", Some("2"), Some("16")).is_lt());
        assert!(compare_cells("model", Some("a"), None).is_lt());
    }
}
