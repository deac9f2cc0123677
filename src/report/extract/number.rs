//! Numbers as the foreign logs print them, shared by their parsers (`hf`, `llmc`): a leaf that
//! imports only the row's [`Num`].

use crate::report::row::Num;

/// A number as a log prints it: `8` an integer, `8.0` / `1e-3` / `nan` a float.
pub(super) fn num(s: &str) -> Option<Num> {
    let s = s.trim().trim_matches('\'');
    if let Ok(i) = s.parse::<i64>() {
        return Some(Num::Int(i));
    }
    s.parse::<f64>().ok().map(Num::Float)
}

/// A number that is a float whatever it looks like (a loss printed `10` is still a loss).
pub(super) fn float(s: &str) -> Option<f64> {
    num(s).map(Num::as_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_stay_integers() {
        assert_eq!(num("117"), Some(Num::Int(117)));
        assert_eq!(num("'8'"), Some(Num::Int(8)));
        assert_eq!(num("2.6667"), Some(Num::Float(2.6667)));
        assert_eq!(num("1.25e-05"), Some(Num::Float(1.25e-5)));
        assert!(matches!(num("nan"), Some(Num::Float(f)) if f.is_nan()));
        assert_eq!(num("x"), None);
        assert_eq!(float("10"), Some(10.0));
    }
}
