//! transformer-bench: fixed transformer workloads, run the same way on every machine.
//!
//! Data flows one way: CLI → plan → launcher → scenario (engine, trackers) → record → report.
//! Nothing below imports anything above it.
//!
//! - [`cli`]: the `bench` command line: arguments, the typed plan, the commands.
//! - [`launch`]: which processes run a plan (this one, sweep children, parallel ranks).
//! - [`scenarios`]: what is run and scored (LAMBADA scoring, LAMBADA and text generation, the
//!   generation suite, WikiText-2 and Tiny Shakespeare training, verify).
//! - [`engines`]: who runs the model (candle, the HF worker, llm.c's trainer), one trait per
//!   capability; [`hub`]: HF hub ids, a checkpoint in the HF cache.
//! - [`train`]: candle's training step and optimizer.
//! - [`models`]: GPT-2 and BLOOM in candle behind [`models::CausalLm`], with the KV cache and
//!   greedy decoding; [`kernels`]: fused CUDA kernels; [`dist`]: ranks, rendezvous and
//!   collectives.
//! - [`trackers`]: latency, memory, NVML; [`metrics`]: every metric's formula and every
//!   summary, and the candle-vs-HF agreement tolerances; [`flops`]: model FLOPs, per-GPU peaks
//!   and MFU.
//! - [`record`]: the JSONL schema, the contract with the tools that read results; [`log`]:
//!   writing and reading run logs; [`llmc_output`]: llm.c's stdout lines, read by the llmc
//!   engine and by `extract-metrics`.
//! - [`report`]: console tables, and (feature `report`) `extract-metrics` and `plot`: logs ->
//!   CSV, Markdown tables, charts.
//! - [`fuzz`] (feature `report`): a stable-Rust fuzzer of the log, suite and LAMBADA parsers.
//! - [`env`]: the environment report (`bench env`, every log header).
//! - [`data`], [`tokenizer`], [`device`], [`progress`], [`profile`], [`error`]: data files,
//!   tokenizers, `--device` / `--dtype`, progress on stderr, the CUDA profiler window, typed
//!   errors.

pub mod cli;
pub mod data;
pub mod device;
pub mod dist;
pub mod engines;
pub mod env;
pub mod error;
pub mod flops;
#[cfg(feature = "report")]
pub mod fuzz;
#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
pub mod hub;
pub mod kernels;
pub mod launch;
pub mod llmc_output;
pub mod log;
pub mod metrics;
pub mod models;
pub mod profile;
pub mod progress;
pub mod record;
pub mod report;
pub mod scenarios;
pub mod tokenizer;
pub mod trackers;
pub mod train;

pub use error::{Error, Result};

/// `git describe`-style commit baked in at build time (build.rs).
pub const GIT_COMMIT: &str = env!("TB_GIT_COMMIT");
