//! The run log: one JSONL file per run, the one contract between `bench` and the tools that
//! read its results. Record 1 is a [`Header`], then one [`BatchRecord`] per timed batch, then a
//! [`Summary`]. Each record is written with a single `write` as soon as it exists, so a run
//! that dies half-way keeps every finished record.
//!
//! Schema versions: 1 (this one).

use crate::env::HostInfo;
use crate::error::{Error, Result};
use crate::models::ModelInfo;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    Header(Box<Header>),
    Batch(BatchRecord),
    Summary(Box<Summary>),
    /// Training suites: one per optimizer step, then a [`TrainSummary`] instead of a [`Summary`].
    Step(StepRecord),
    TrainSummary(Box<TrainSummary>),
}

/// Training set-up recorded in the header of a training run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainInfo {
    /// Which files were trained and evaluated on, e.g. "trained on wiki.valid.raw, evaluated on
    /// wiki.test.raw (no wiki.train.raw here)".
    pub note: String,
    pub eval_data: DataInfo,
    pub block_size: usize,
    pub n_train_blocks: usize,
    pub n_eval_blocks: usize,
    pub eval_batch_size: usize,
    pub grad_accum: usize,
    pub epochs: f64,
    pub max_steps: usize,
    pub dropout: bool,
    pub hyper: crate::train::Hyper,
    /// How the rates exclude warm-up.
    pub timing: String,
}

/// One optimizer step.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    /// 1-based, as HF's `global_step`.
    pub step: usize,
    pub epoch: f64,
    /// Mean of the step's micro-batch losses.
    pub loss: f64,
    pub learning_rate: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Device synchronized at both ends: forward, backward, clipping, optimizer update.
    pub latency_ms: f64,
    pub n_samples: usize,
    pub n_tokens: usize,
    /// A warm-up step: trained, but left out of the rates.
    pub warmup: bool,
    /// fp16: skipped for inf/NaN gradients.
    #[serde(default)]
    pub skipped: bool,
    #[serde(default)]
    pub loss_scale: Option<f64>,
}

/// End of a training run, with HF Trainer's metric names where HF has one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainSummary {
    pub status: String,
    pub error: Option<String>,
    /// Optimizer steps, warm-up included.
    pub n_steps: usize,
    pub warmup_steps: usize,
    /// Seconds of the timed (non-warm-up) steps: the sum of their latencies.
    pub train_runtime: f64,
    /// Blocks trained in timed steps / train_runtime.
    pub train_samples_per_second: f64,
    /// Timed steps / train_runtime.
    pub train_steps_per_second: f64,
    /// Tokens trained in timed steps / train_runtime.
    pub tokens_per_second: f64,
    /// Mean of every step's loss (warm-up included), as HF's `train_loss`.
    pub train_loss: f64,
    /// Loss of the first and last step.
    pub first_loss: f64,
    pub last_loss: f64,
    /// Mean next-token loss over the eval blocks.
    pub eval_loss: f64,
    pub eval_runtime: f64,
    pub eval_samples_per_second: f64,
    /// exp(eval_loss), as run_clm's `perplexity`.
    pub perplexity: f64,
    pub step_latency_ms_p50: f64,
    pub step_latency_ms_p90: f64,
    pub step_latency_ms_mean: f64,
    /// Whole run: load, tokenize, train, eval, logging.
    pub wall_seconds: f64,
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub peak_host_memory_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DataInfo {
    /// File path, or `embedded:NAME` for the sample built into the binary.
    pub path: String,
    pub sha256: String,
    pub n_samples: usize,
    /// Whether `sha256` equals the suite file's checksum of the full data set (None for other files).
    pub matches_reference: Option<bool>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub schema_version: u32,
    pub tool: String,
    pub tool_version: String,
    /// Commit the binary was built from; `-dirty` when the tree had uncommitted changes.
    pub git_commit: String,
    pub time_utc: String,
    pub command_line: Vec<String>,
    /// `candle` (this binary) or `hf` (transformers + PyTorch).
    pub engine: String,
    /// The engine's versions and settings: candle's version; for `hf`: torch, transformers,
    /// CUDA (torch's), python, gpu, attn (eager/sdpa), compile.
    #[serde(default)]
    pub engine_info: std::collections::BTreeMap<String, String>,
    pub suite: String,
    pub model: ModelInfo,
    pub tokenizer: String,
    pub dtype: String,
    pub device: String,
    pub host: HostInfo,
    pub batch_size: usize,
    pub warmup_batches: usize,
    pub seed: Option<u64>,
    pub limit: Option<usize>,
    pub data: DataInfo,
    /// Load time of the weights (random init or checkpoint), seconds.
    pub load_seconds: f64,
    /// Training suites only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<Box<TrainInfo>>,
}

/// One LAMBADA passage's result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PassageResult {
    /// Line index (0-based) in the data file.
    pub index: usize,
    /// Summed log-probability of the target word's tokens (natural log).
    pub ll: f64,
    /// Every target token was the argmax.
    pub greedy: bool,
    pub n_context_tokens: usize,
    pub n_target_tokens: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BatchRecord {
    /// 0-based index among the timed batches.
    pub batch: usize,
    pub n_samples: usize,
    /// Real (non-padding) input tokens.
    pub n_tokens: usize,
    /// Length every row was right-padded to.
    pub padded_len: usize,
    /// Wall time of the batch, device synchronized at both ends: host->device copy, forward,
    /// scoring, results back on the host.
    pub latency_ms: f64,
    pub passages: Vec<PassageResult>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// `ok`, or `error` with `error` set (a run that failed after some batches).
    pub status: String,
    pub error: Option<String>,
    pub n_samples: usize,
    pub n_batches: usize,
    pub n_tokens: usize,
    /// lm-eval `acc`: see [`crate::metrics::lambada_accuracy`].
    pub accuracy: f64,
    /// lm-eval `perplexity`: see [`crate::metrics::lambada_perplexity`].
    pub perplexity: f64,
    /// Passages / timed seconds (the sum of batch latencies).
    pub samples_per_second: f64,
    /// Real input tokens / timed seconds.
    pub tokens_per_second: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p90: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_mean: f64,
    pub latency_ms_stdev: f64,
    /// Sum of batch latencies, seconds.
    pub timed_seconds: f64,
    /// Whole run: load, warmup, timed batches, logging.
    pub wall_seconds: f64,
    /// See [`crate::trackers::MemoryTracker`].
    pub peak_memory_bytes: u64,
    pub device_memory_used_bytes: Option<u64>,
    /// Peak resident set of the process (VmHWM): with safetensors checkpoints it includes the
    /// mapped file pages read, which the kernel can drop; with random weights no weights pass
    /// through the host.
    #[serde(default)]
    pub peak_host_memory_bytes: Option<u64>,
}

/// An open run log.
pub struct RunLog {
    path: PathBuf,
    file: File,
}

impl RunLog {
    /// Creates `dir/stem.jsonl` (`stem-1.jsonl`, … if taken); never overwrites a log.
    pub fn create(dir: &Path, stem: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating log dir {}", dir.display()), e))?;
        for n in 0.. {
            let name = if n == 0 {
                format!("{stem}.jsonl")
            } else {
                format!("{stem}-{n}.jsonl")
            };
            let path = dir.join(name);
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => return Ok(Self { path, file }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(format!("creating {}", path.display()), e)),
            }
        }
        unreachable!()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as one line, in one write: it is on disk (page cache) on return.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_string(record).expect("records serialize");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", self.path.display()), e))
    }
}

/// Reads a run log back, skipping a torn last line (a run killed mid-write).
pub fn read_log(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(r) => records.push(r),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(e) => {
                return Err(Error::BadData {
                    path: path.display().to_string(),
                    line: i + 1,
                    msg: format!("not a run-log record: {e}"),
                })
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_line_is_skipped_but_garbage_inside_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RunLog::create(dir.path(), "run").unwrap();
        let summary_line = r#"{"record":"batch","batch":0,"n_samples":1,"n_tokens":3,"padded_len":3,"latency_ms":1.5,"passages":[]}"#;
        log.write(&serde_json::from_str(summary_line).unwrap())
            .unwrap();
        let path = log.path().to_path_buf();
        // A run killed in the middle of a write leaves a partial line.
        std::fs::write(&path, format!("{summary_line}\n{{\"record\":\"ba")).unwrap();
        assert_eq!(read_log(&path).unwrap().len(), 1);
        std::fs::write(&path, format!("nonsense\n{summary_line}\n")).unwrap();
        let err = read_log(&path).unwrap_err().to_string();
        assert!(err.contains(":1: not a run-log record"), "{err}");
    }

    #[test]
    fn logs_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let a = RunLog::create(dir.path(), "run").unwrap();
        let b = RunLog::create(dir.path(), "run").unwrap();
        assert_ne!(a.path(), b.path());
    }
}
