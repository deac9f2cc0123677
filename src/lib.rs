//! transformer-bench: fixed transformer workloads, run the same way on every machine.
//!
//! - [`models`]: GPT-2 in candle behind the [`models::CausalLm`] trait; weights from HF
//!   safetensors or random with HF's init.
//! - [`suites`]: workloads and their scoring (LAMBADA as lm-eval `lambada_openai`).
//! - [`trackers`]: latency and memory measurement; [`metrics`]: every metric's formula.
//! - [`record`]: the JSONL run log, the contract with the tools that read results.
//! - [`runner`]: one run end to end; [`cli`]: the `bench` command line.

pub mod cli;
pub mod data;
pub mod device;
pub mod engines;
pub mod env;
pub mod error;
#[cfg(feature = "report")]
pub mod extract;
pub mod metrics;
pub mod models;
#[cfg(feature = "report")]
pub mod plot;
pub mod record;
pub mod runner;
pub mod suites;
pub mod tokenizer;
pub mod trackers;
pub mod train;
pub mod train_runner;
pub mod verify;

pub use error::{Error, Result};
