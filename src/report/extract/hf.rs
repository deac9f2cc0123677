//! HF Trainer's outputs: its stdout (`***** train metrics *****` blocks, `{'loss': …}` step
//! logs), `*_results.json` and `trainer_state.json`. Step logs give `*_last` columns
//! ([`super::schema::last`]); summaries keep HF's names, which are ours.

use super::number::{float, num};
use super::schema::{canonical, last};
use crate::report::row::{Num, RunRow};
use regex::Regex;
use std::sync::LazyLock;

static HF_BLOCK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\*\*\*\*\* (\w+) metrics \*\*\*\*\*").unwrap());
static HF_METRIC: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s+(\w+)\s+=\s+(\S+)\s*$").unwrap());
static HF_DICT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\{'\w+': .*\}\s*$").unwrap());
static HF_PAIR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"'(\w+)': '?([-\d.eE+]+|nan|inf)'?").unwrap());

/// Whether `text` looks like HF Trainer stdout.
pub(super) fn is_trainer_log(text: &str) -> bool {
    HF_BLOCK.is_match(text) || text.lines().any(|l| HF_DICT.is_match(l.trim_end()))
}

/// HF Trainer's formatted values: plain numbers, `0:03:14.38` durations (→ seconds) and
/// `4208495GF` FLOP counts (→ FLOPs).
fn hf_value(s: &str) -> Option<Num> {
    if let Some(gf) = s.strip_suffix("GF") {
        return float(gf).map(|v| Num::Float(v * 1e9));
    }
    if s.contains(':') {
        let parts: Vec<f64> = s.split(':').map(float).collect::<Option<_>>()?;
        return Some(Num::Float(parts.iter().fold(0., |acc, p| acc * 60. + p)));
    }
    num(s)
}

pub(super) fn trainer_log(row: &mut RunRow, text: &str) -> usize {
    let (mut skipped, mut in_block, mut n_logs) = (0, false, 0usize);
    for line in text.lines() {
        if HF_BLOCK.is_match(line) {
            in_block = true;
        } else if let (true, Some(c)) = (in_block, HF_METRIC.captures(line)) {
            if let Some(v) = hf_value(&c[2]) {
                row.set(canonical(&c[1]), v);
            }
        } else if HF_DICT.is_match(line.trim_end()) {
            in_block = false;
            let pairs: Vec<_> = HF_PAIR.captures_iter(line).collect();
            // The Trainer's last dict is its train summary; the others are logging steps.
            if pairs.iter().any(|c| &c[1] == "loss") {
                n_logs += 1;
                for c in &pairs {
                    if let Some(v) = float(&c[2]) {
                        row.set(last(&c[1]), v);
                    }
                }
            }
        } else {
            in_block = false;
            if !line.trim().is_empty() {
                skipped += 1;
            }
        }
    }
    if n_logs > 0 {
        row.set("n_log_steps", n_logs);
    }
    skipped
}

pub(super) fn results_json(row: &mut RunRow, text: &str) -> usize {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) else {
        return 1;
    };
    for (k, v) in map {
        if let Some(n) = Num::from_json(&v) {
            row.set(canonical(&k), n);
        }
    }
    0
}

pub(super) fn trainer_state(row: &mut RunRow, text: &str) -> usize {
    let Ok(state) = serde_json::from_str::<serde_json::Value>(text) else {
        return 1;
    };
    for k in ["global_step", "epoch"] {
        if let Some(v) = Num::from_json(&state[k]) {
            row.set(canonical(k), v);
        }
    }
    let mut n_logs = 0usize;
    for entry in state["log_history"].as_array().into_iter().flatten() {
        let Some(obj) = entry.as_object() else {
            continue;
        };
        let is_step = obj.contains_key("loss");
        n_logs += is_step as usize;
        for (k, v) in obj {
            if let Some(n) = Num::from_json(v) {
                // Step logs keep their last value; summaries (train_*, eval_*) as they are.
                let key = if is_step {
                    last(k)
                } else {
                    canonical(k).to_string()
                };
                row.set(key, n);
            }
        }
    }
    row.set("n_log_steps", n_logs);
    0
}
