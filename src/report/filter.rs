//! `--where KEY=VALUE`: keep the rows whose column KEY equals VALUE. Text compares as text;
//! where both sides read as numbers they compare as numbers, so `batch_size=16` matches a
//! column written `16` or `16.0`.

use crate::error::{Error, Result};

/// One `KEY=VALUE` condition.
#[derive(Clone, Debug, PartialEq)]
pub struct Where {
    pub key: String,
    pub value: String,
}

impl Where {
    /// Parses `KEY=VALUE` (the value may itself hold `=`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok(Self {
                key: k.trim().to_string(),
                value: v.trim().to_string(),
            }),
            _ => Err(Error::Config(format!(
                "--where {s}: expected KEY=VALUE, e.g. --where model=gpt2"
            ))),
        }
    }

    /// Every condition of a command line.
    pub fn parse_all(items: &[String]) -> Result<Vec<Self>> {
        items.iter().map(|s| Self::parse(s)).collect()
    }

    /// Whether a cell (its text, None when empty) satisfies the condition.
    pub fn matches(&self, cell: Option<&str>) -> bool {
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
}
