//! Scenarios: what is run and scored, one module a workload, each owning its data, its step
//! and what its summary adds, and talking to engines through one trait per capability
//! ([`crate::engines::Score`], [`crate::engines::Train`]).
//!
//! - [`spec`]: the fully resolved run ([`RunSpec`]) a scenario receives.
//! - [`skeleton`]: the run's sequence, the same for every scenario ([`skeleton::run`]: engines
//!   and weights, the scenario's start, the log, its run, the last record; for a scenario timed
//!   in passes, [`skeleton::Timed`], the warm-up, GPU trackers, passes, memory and summary too)
//!   and what scenarios share (padding, warm-up choice, log header and name); [`passes`]: how
//!   long the timed loop runs (`--min-time`, `--min-batches`).
//! - [`lambada`]: LAMBADA scored like lm-eval `lambada_openai`.
//! - [`generate`]: greedy generation with a KV cache: LAMBADA the FasterTransformer way
//!   (`--mode generate`) and the generation suite (time to first token, inter-token latency).
//! - [`serving`]: requests arriving over time (open or closed loop), served by static batching
//!   of what has arrived: TTFT, TPOT, E2E, goodput.
//! - [`train`]: causal-LM training with HF Trainer's semantics, one scenario over two data
//!   sources: WikiText-2 (run_clm data, [`train::data`]) and Tiny Shakespeare
//!   ([`train::shakespeare`]: llm.c's split).
//! - [`verify`]: this engine against HF reference fixtures (`bench verify`).
//! - [`suite_file`]: each suite's defaults (`suites/NAME.toml`, embedded).

pub mod generate;
pub mod lambada;
pub mod passes;
pub mod serving;
pub mod skeleton;
pub mod spec;
pub mod suite_file;
pub mod train;
pub mod verify;

pub use spec::{
    DpRun, GenerateOptions, GenerateSource, HfParallel, RunSpec, ServeOptions, TrainOptions,
    Workload,
};
