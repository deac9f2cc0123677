//! `--where KEY=VALUE`: keep the rows whose column KEY equals VALUE (`KEY!=VALUE`: those whose
//! KEY differs, an empty cell included). Text compares as text; where both sides read as
//! numbers they compare as numbers, so `batch_size=16` matches a column written `16` or `16.0`.

use crate::error::{Error, Result};

/// One `KEY=VALUE` condition.
#[derive(Clone, Debug, PartialEq)]
pub struct Where {
    pub key: String,
    pub value: String,
    /// `KEY!=VALUE`: the rows that do not match.
    pub negated: bool,
}

impl Where {
    /// Parses `KEY=VALUE` or `KEY!=VALUE` (the value may itself hold `=`).
    pub fn parse(s: &str) -> Result<Self> {
        let Some((k, v)) = s.split_once('=') else {
            return Err(Error::Config(format!(
                "--where {s}: expected KEY=VALUE or KEY!=VALUE, e.g. --where model=gpt2"
            )));
        };
        let (k, negated) = match k.strip_suffix('!') {
            Some(k) => (k, true),
            None => (k, false),
        };
        if k.trim().is_empty() {
            return Err(Error::Config(format!(
                "--where {s}: expected KEY=VALUE or KEY!=VALUE, e.g. --where model=gpt2"
            )));
        }
        Ok(Self {
            key: k.trim().to_string(),
            value: v.trim().to_string(),
            negated,
        })
    }

    /// The condition as it was written: `KEY=VALUE` or `KEY!=VALUE`.
    pub fn text(&self) -> String {
        let op = if self.negated { "!=" } else { "=" };
        format!("{}{op}{}", self.key, self.value)
    }

    /// Every condition of a command line.
    pub fn parse_all(items: &[String]) -> Result<Vec<Self>> {
        items.iter().map(|s| Self::parse(s)).collect()
    }

    /// Whether a cell (its text, None when empty) satisfies the condition.
    pub fn matches(&self, cell: Option<&str>) -> bool {
        self.equals(cell) != self.negated
    }

    fn equals(&self, cell: Option<&str>) -> bool {
        let Some(cell) = cell else {
            return self.value.is_empty();
        };
        if cell == self.value {
            return true;
        }
        match (cell.parse::<f64>(), self.value.parse::<f64>()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_as_numbers_and_text_as_text() {
        let w = Where::parse("batch_size=16").unwrap();
        assert!(w.matches(Some("16.0")) && w.matches(Some("16")) && !w.matches(Some("1")));
        let w = Where::parse(" model = gpt2 ").unwrap();
        assert!(w.matches(Some("gpt2")) && !w.matches(Some("gpt2-xl")) && !w.matches(None));
        assert_eq!(Where::parse("a=b=c").unwrap().value, "b=c");
        let err = Where::parse("model").unwrap_err().to_string();
        assert!(err.contains("expected KEY=VALUE"), "{err}");
        assert!(Where::parse("=x").is_err());
    }

    #[test]
    fn not_equal_keeps_the_other_rows_and_empty_cells() {
        let w = Where::parse("run!=a=b").unwrap();
        assert_eq!(
            (w.key.as_str(), w.value.as_str(), w.negated),
            ("run", "a=b", true)
        );
        assert!(!w.matches(Some("a=b")) && w.matches(Some("c")) && w.matches(None));
        let w = Where::parse("batch_size!=16").unwrap();
        assert!(!w.matches(Some("16.0")) && w.matches(Some("1")));
        assert_eq!(w.text(), "batch_size!=16");
        assert!(Where::parse("!=x").is_err());
    }
}
