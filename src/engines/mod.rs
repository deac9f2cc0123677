//! Engines run a model on batches the suites prepare; suites decide what to run and score it.
//! Both engines get the same token ids, batches and padding, and report per-token scores and a
//! latency measured with the same rule (device synchronized before each clock read), so the
//! Rust side computes every metric with one piece of code.
//!
//! - [`candle::CandleEngine`]: this crate's models.
//! - [`hf::HfEngine`]: HF transformers + PyTorch in a Python worker process.

pub mod candle;
pub mod hf;

use crate::error::Result;
use crate::suites::lambada::{Request, TargetScores};
use crate::trackers::MemoryReading;
use std::collections::BTreeMap;

/// Which engine(s) a run uses (`--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// This crate's models in candle.
    Candle,
    /// HF transformers + PyTorch (Python worker).
    Hf,
    /// Candle, then HF on the same weights and data, with a side-by-side summary.
    Both,
}

/// One batch's scores and the engine's own measurement of it.
pub struct BatchOutput {
    pub scores: TargetScores,
    /// Milliseconds, device synchronized at both ends: ids to the device, forward, LM head on the
    /// target rows, log-softmax in fp32, results back on the host.
    pub latency_ms: f64,
}

pub trait Engine {
    /// `candle` or `hf`, as logged.
    fn name(&self) -> &'static str;
    /// Versions and settings recorded in the log header (library versions, attention kind…).
    fn info(&self) -> BTreeMap<String, String>;
    /// Longest input the model takes.
    fn max_positions(&self) -> usize;
    /// Seconds the weights took to load.
    fn load_seconds(&self) -> f64;
    fn score(&mut self, batch: &[Request]) -> Result<BatchOutput>;
    /// The process that holds the GPU memory (this one, or a worker's), for NVML.
    fn pid(&self) -> u32 {
        std::process::id()
    }
    /// Ends the run; returns the peak memory (see [`crate::trackers::MemoryTracker`]).
    fn finish(&mut self) -> Result<MemoryReading>;
}
