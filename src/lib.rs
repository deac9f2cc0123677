//! transformer-bench: fixed transformer workloads, run the same way on every machine.
//!
//! - [`models`]: GPT-2 in candle behind the [`models::CausalLm`] trait; weights from HF
//!   safetensors or random with HF's init.
//! - [`suites`]: workloads and their scoring (LAMBADA as lm-eval `lambada_openai`).
//! - [`trackers`]: latency, memory, NVML memory / clocks / energy; [`metrics`]: every metric's
//!   formula; [`flops`]: model FLOPs, per-GPU peaks and MFU.
//! - [`env`]: the environment report (`bench env`, every log header).
//! - [`record`]: the JSONL run log, the contract with the tools that read results.
//! - [`runner`]: one run end to end; [`sweep`]: a matrix of runs, each in a child process;
//!   [`cli`]: the `bench` command line.
//! - [`dist`]: multi-process launch (self-spawned, torchrun, Open MPI, Slurm) and rendezvous.

pub mod cli;
pub mod data;
pub mod device;
pub mod dist;
pub mod engines;
pub mod env;
pub mod error;
#[cfg(feature = "report")]
pub mod extract;
pub mod flops;
pub mod hub;
pub mod kernels;
pub mod metrics;
pub mod models;
#[cfg(feature = "report")]
pub mod plot;
pub mod profile;
pub mod record;
pub mod runner;
pub mod suites;
pub mod sweep;
pub mod tokenizer;
pub mod trackers;
pub mod train;
pub mod train_runner;
pub mod verify;

pub use error::{Error, Result};
