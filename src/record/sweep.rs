//! A sweep's own log, `sweep.jsonl`, beside its runs' logs: a [`SweepHeader`] per invocation,
//! one [`SweepRun`] per finished child process and one [`SweepRepeats`] per configuration once
//! its repeats are done; and what a sweep returns ([`SweepOutcome`]), which the launcher
//! (`crate::launch::sweep`) makes and the console tables print.

use super::Recompute;
use super::RunStatus;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The sweep log's file name inside a sweep directory.
pub const SWEEP_LOG: &str = "sweep.jsonl";

/// One configuration of a sweep: a point of the `--models × --dtypes × --batch-sizes ×
/// --seq-lens × --request-rate × --engines` product.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct SweepConfig {
    pub model: String,
    pub dtype: String,
    pub batch_size: usize,
    /// None: the model's maximum context. The generation suite: the prompt length.
    pub seq_len: Option<usize>,
    pub engine: String,
    /// The generation suite: new tokens per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_tokens: Option<usize>,
    /// `--strategies`: the ZeRO level of the configuration's `--dp` ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero: Option<u8>,
    /// Training: `--recompute` blocks or mlp (absent: off; `true` in logs before mlp).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "recompute_or_bool"
    )]
    pub recompute: Option<Recompute>,
    /// The serving suite: `--request-rate`, requests/s as written (`4`, `0.5`, `inf`); text,
    /// so that a configuration stays comparable and ordered (and `inf` needs no JSON number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_rate: Option<String>,
}

impl SweepConfig {
    /// Identifies the configuration in a sweep log (and for `--resume`).
    pub fn key(&self) -> String {
        let seq = self.seq_len.map_or("max".to_string(), |s| s.to_string());
        let new = self
            .new_tokens
            .map(|n| format!(" new={n}"))
            .unwrap_or_default();
        let zero = self.zero.map(|z| format!(" zero={z}")).unwrap_or_default();
        // Blocks keeps the key it had when it was the only kind (`--resume` of older sweeps).
        let recompute = match self.recompute {
            Some(Recompute::Blocks) => " recompute=on",
            Some(Recompute::Mlp) => " recompute=mlp",
            Some(Recompute::Off) | None => "",
        };
        let rate = self
            .request_rate
            .as_ref()
            .map(|r| format!(" rate={r}"))
            .unwrap_or_default();
        format!(
            "model={} dtype={} batch={} seq={seq}{new}{zero}{recompute}{rate} engine={}",
            self.model, self.dtype, self.batch_size, self.engine
        )
    }
}

/// Written when a sweep starts or resumes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SweepHeader {
    pub schema_version: u32,
    pub tool_version: String,
    pub git_commit: String,
    pub time_utc: String,
    pub command_line: Vec<String>,
    pub suite: String,
    pub device: String,
    pub resumed: bool,
    pub repeat: usize,
    pub configs: Vec<SweepConfig>,
}

/// One child process of a sweep: a configuration's run (one repeat), however it ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SweepRun {
    pub config: SweepConfig,
    pub repeat: usize,
    /// `ok`, `oom` (out of memory, CUDA's or the host's), `error` (any other failure),
    /// `killed` (ended by a signal, e.g. the OOM killer) or `timeout` (`--run-timeout`).
    pub status: RunStatus,
    /// The child's own error message, or the last lines of its stderr.
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub wall_seconds: f64,
    /// Run logs the child wrote, relative to the sweep directory (none if it failed before its
    /// header: then this record is the only trace, and extract-metrics reads it).
    pub logs: Vec<String>,
    pub samples_per_second: Option<f64>,
    pub latency_ms_p50: Option<f64>,
}

/// Median, extremes and coefficient of variation of one metric over a configuration's repeats.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Sample standard deviation / mean (0 for one repeat).
    pub cv: f64,
}

/// A configuration's repeats folded, once the last of them has run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SweepRepeats {
    pub config: SweepConfig,
    pub n_repeats: usize,
    pub n_ok: usize,
    pub samples_per_second: Option<Spread>,
    pub tokens_per_second: Option<Spread>,
    pub latency_ms_p50: Option<Spread>,
}

impl SweepRun {
    /// One line about a finished run: its configuration and how it ended.
    pub fn line(&self) -> String {
        let what = format!("{} r{}", self.config.key(), self.repeat);
        match (&self.status, self.samples_per_second) {
            // A serving run's rate is its requests/s.
            (RunStatus::Ok, Some(sps)) if self.config.request_rate.is_some() => {
                format!("{what}: ok, {sps:.2} req/s")
            }
            (RunStatus::Ok, Some(sps)) => format!("{what}: ok, {sps:.2} samples/s"),
            (status, _) => format!(
                "{what}: {status}{}",
                self.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        }
    }
}

/// What a sweep did: its directory, this invocation's runs and folded repeats.
pub struct SweepOutcome {
    pub dir: PathBuf,
    pub runs: Vec<SweepRun>,
    pub repeats: Vec<SweepRepeats>,
    /// Runs done by an earlier invocation and skipped by `--resume`.
    pub skipped: usize,
}

impl SweepOutcome {
    /// Every run ended `ok` or `oom` (an out-of-memory is a result of the sweep, not a failure).
    pub fn succeeded(&self) -> bool {
        self.runs.iter().all(|r| r.status.is_done())
    }

    /// How many of this invocation's runs ended `status`.
    pub fn count(&self, status: &RunStatus) -> usize {
        self.runs.iter().filter(|r| r.status == *status).count()
    }
}

/// A sweep configuration's `recompute`: its name, or the `true` / `false` of logs written
/// when blocks were the only kind.
fn recompute_or_bool<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Recompute>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Bool(bool),
        Kind(Recompute),
    }
    Ok(match Option::<Written>::deserialize(d)? {
        None | Some(Written::Bool(false)) => None,
        Some(Written::Bool(true)) => Some(Recompute::Blocks),
        Some(Written::Kind(k)) => Some(k),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep log from before `--recompute mlp` (`true`) reads as blocks, with the key it had
    /// (so `--resume` finds its runs); mlp round-trips under a key of its own.
    #[test]
    fn recompute_reads_old_booleans_and_keys_each_kind_apart() {
        let config = |recompute: &str| -> SweepConfig {
            serde_json::from_str(&format!(
                r#"{{"model":"gpt2","dtype":"bf16","batch_size":8,"seq_len":null,"engine":"candle","zero":3{recompute}}}"#
            ))
            .unwrap()
        };
        let old = config(r#","recompute":true"#);
        assert_eq!(old.recompute, Some(Recompute::Blocks));
        assert!(
            old.key().ends_with("zero=3 recompute=on engine=candle"),
            "{}",
            old.key()
        );
        assert_eq!(config(r#","recompute":false"#).recompute, None);
        assert_eq!(config("").recompute, None);
        let mlp = config(r#","recompute":"mlp""#);
        assert_eq!(mlp.recompute, Some(Recompute::Mlp));
        assert!(mlp.key().contains(" recompute=mlp "), "{}", mlp.key());
        let again: SweepConfig =
            serde_json::from_str(&serde_json::to_string(&mlp).unwrap()).unwrap();
        assert_eq!(again.recompute, Some(Recompute::Mlp));
        assert_ne!(old.key(), mlp.key());
    }
}
