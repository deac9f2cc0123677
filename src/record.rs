//! The run log: one JSONL file per run, the one contract between `bench` and the tools that
//! read its results. Record 1 is a [`Header`], then one [`BatchRecord`] per timed batch, then a
//! [`Summary`]. Each record is written with a single `write` as soon as it exists, so a run
//! that dies half-way keeps every finished record.
//!
//! A sweep (`crate::launch::sweep`) keeps its own log, `sweep.jsonl`, beside its runs' logs
//! ([`sweep`]: a [`SweepHeader`] per invocation, one [`SweepRun`] per finished child process
//! and one [`SweepRepeats`] per configuration once its repeats are done). Every run's status is
//! a [`RunStatus`].
//!
//! Schema versions: 1 (this one; sweep records and `seq_len` / `repeat` were added later as
//! optional fields, so every version-1 reader still reads run logs).

use crate::env::EnvReport;
use crate::models::ModelInfo;
use serde::{Deserialize, Serialize};

pub mod recompute;
pub mod serving;
mod status;
pub mod sweep;
pub use recompute::Recompute;
pub use serving::{Percentiles, RequestRecord, ServingInfo, ServingSummary};
pub use status::RunStatus;
pub use sweep::{
    Spread, SweepConfig, SweepHeader, SweepOutcome, SweepRepeats, SweepRun, SWEEP_LOG,
};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    Header(Box<Header>),
    Batch(BatchRecord),
    Summary(Box<Summary>),
    SweepHeader(Box<SweepHeader>),
    SweepRun(Box<SweepRun>),
    SweepRepeats(Box<SweepRepeats>),
    /// Training suites: one per optimizer step, then a [`TrainSummary`] instead of a [`Summary`].
    Step(StepRecord),
    /// Generation runs (`--mode generate`, `--suite generation`): one per generation call, in
    /// place of [`BatchRecord`]s.
    GenBatch(GenBatchRecord),
    TrainSummary(Box<TrainSummary>),
    /// The serving suite: one per request as its batch ends, then a [`ServingSummary`].
    Request(Box<RequestRecord>),
    ServingSummary(Box<ServingSummary>),
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
    /// Each epoch's last partial batch dropped (HF's dataloader_drop_last); absent in older logs.
    #[serde(default)]
    pub drop_last: bool,
    pub hyper: Hyper,
    /// How the rates exclude warm-up.
    pub timing: String,
}

/// HF `TrainingArguments` defaults that shape the optimization.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hyper {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    /// Linear warm-up of the learning rate, optimizer steps (HF `warmup_steps`).
    pub lr_warmup_steps: usize,
    /// Optimizer steps of the whole run: the linear decay reaches 0 here.
    pub total_steps: usize,
    pub grad_accum: usize,
}

impl Default for Hyper {
    fn default() -> Self {
        Self {
            learning_rate: 5e-5,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.,
            max_grad_norm: 1.0,
            lr_warmup_steps: 0,
            total_steps: 1,
            grad_accum: 1,
        }
    }
}

/// One optimizer step's log line: an engine's `TimedStep` with its number, epoch and counts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    /// 1-based, as HF's `global_step`.
    pub step: usize,
    pub epoch: f64,
    /// Mean of the step's micro-batch losses.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    pub learning_rate: f64,
    /// Global L2 norm of the gradients before clipping.
    #[serde(deserialize_with = "nan_if_null")]
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
    /// `--phase-times`: where the step's time went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases_ms: Option<PhaseMs>,
    /// Data parallelism: milliseconds this step spent in all-reduces on rank 0's device timeline
    /// (CUDA events around them: the part of them the backward did not hide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_ms: Option<f64>,
    /// candle: milliseconds the host took to queue the step before its one sync (near
    /// latency_ms: the step is host-bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ms: Option<f64>,
}

/// A training step split into phases, each ended by a device synchronize (`--phase-times`),
/// summed over the step's micro-batches.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseMs {
    pub forward: f64,
    pub backward: f64,
    /// Gradient accumulation and casts, clipping, optimizer update.
    pub update: f64,
}

/// End of a training run, with HF Trainer's metric names where HF has one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TrainSummary {
    pub status: RunStatus,
    pub error: Option<String>,
    /// Optimizer steps, warm-up included.
    pub n_steps: usize,
    pub warmup_steps: usize,
    /// Seconds of the timed (non-warm-up) steps: the sum of their latencies.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_runtime: f64,
    /// Blocks trained in timed steps / train_runtime.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_samples_per_second: f64,
    /// Timed steps / train_runtime.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_steps_per_second: f64,
    /// Tokens trained in timed steps / train_runtime.
    #[serde(deserialize_with = "nan_if_null")]
    pub tokens_per_second: f64,
    /// Mean of every step's loss (warm-up included), as HF's `train_loss`.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_loss: f64,
    /// Loss of the first and last step.
    #[serde(deserialize_with = "nan_if_null")]
    pub first_loss: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub last_loss: f64,
    /// Mean next-token loss over the eval blocks.
    #[serde(deserialize_with = "nan_if_null")]
    pub eval_loss: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub eval_runtime: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub eval_samples_per_second: f64,
    /// exp(eval_loss), as run_clm's `perplexity`.
    #[serde(deserialize_with = "nan_if_null")]
    pub perplexity: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub step_latency_ms_p50: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub step_latency_ms_p90: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub step_latency_ms_mean: f64,
    /// `--phase-times`: median of each phase over the timed steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases_ms_p50: Option<PhaseMs>,
    /// Data parallelism: share of the timed steps' time spent in all-reduces (rank 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_share: Option<f64>,
    /// Median over the timed steps of the host's time to queue a step (candle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ms_p50: Option<f64>,
    /// Data parallelism: each rank's peak memory (as `peak_memory_bytes`, MiB resolution),
    /// in rank order, over the training steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_rank_peak_memory_bytes: Option<Vec<u64>>,
    /// Whole run: load, tokenize, train, eval, logging.
    #[serde(deserialize_with = "nan_if_null")]
    pub wall_seconds: f64,
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub peak_host_memory_bytes: Option<u64>,
    /// Seconds of the warm-up steps (the sum of their latencies), reported, never in the
    /// rates: torch.compile's compilation with `--hf-compile`, set-up costs otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_runtime: Option<f64>,
    /// Model FLOPs of the timed steps: [`crate::flops::train_block_flops`] per block trained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_flops: Option<f64>,
    /// model_flops / train_runtime / 1e12.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub achieved_tflop_per_second: Option<f64>,
    /// The GPU's dense peak for the run's precision ([`crate::flops::PEAK_TFLOPS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_tflop_per_second: Option<f64>,
    /// achieved / peak, a fraction (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Seconds an epoch takes at the timed steps' rate: optimizer steps per epoch × their mean
    /// latency (the seed benchmarks' "time per epoch").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_seconds: Option<f64>,
    /// peak_memory_bytes / the GPU's memory, a fraction (0..1); None on CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_share: Option<f64>,
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
    /// `candle` (this binary), `hf` (transformers + PyTorch) or `llmc` (llm.c's train_gpt2cu).
    pub engine: String,
    /// The engine's versions and settings: candle's version; for `hf`: torch, transformers,
    /// CUDA (torch's), python, gpu, attn (eager/sdpa), compile; for `llmc`: the binary, its
    /// arguments and where its output is.
    #[serde(default)]
    pub engine_info: std::collections::BTreeMap<String, String>,
    pub suite: String,
    pub model: ModelInfo,
    pub tokenizer: String,
    pub dtype: String,
    pub device: String,
    /// The environment report, as `bench env --json` prints it ([`EnvReport::collect`]).
    pub host: EnvReport,
    /// NVML index of the GPU the run used (`host.gpus[].index`); None on CPU and in older logs.
    #[serde(default)]
    pub gpu_index: Option<usize>,
    pub batch_size: usize,
    pub warmup_batches: usize,
    /// `--min-time`, `--min-batches`: what the timed loop had to reach, in whole passes over
    /// its batches (None for training and in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_time_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_batches: Option<usize>,
    pub seed: Option<u64>,
    pub limit: Option<usize>,
    pub data: DataInfo,
    /// Load time of the weights (random init or checkpoint), seconds.
    pub load_seconds: f64,
    /// `--seq-len`: LAMBADA contexts left-truncated to this many tokens (None: the model's
    /// maximum), as lm-eval's `max_length`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    /// 0-based repeat index when the run is one of a sweep's `--repeat N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<usize>,
    /// Training suites only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<Box<TrainInfo>>,
    /// `--pad-multiple`: batches (scoring) and prompts (generation) padded to a multiple of
    /// this many positions; None for training and in older logs (which padded to the longest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_multiple: Option<usize>,
    /// Tensor-parallel runs only (`--tp N`, N > 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpInfo>,
    /// Data-parallel training runs only (`--dp N`, N > 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp: Option<DpInfo>,
    /// Generation runs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<GenerationInfo>,
    /// The serving suite only: its load and batching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<Box<ServingInfo>>,
    /// What `--device auto` / `--dtype auto` chose and why (`device` and `dtype` hold the
    /// choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<String>,
}

impl Header {
    /// The engine as reports and tables name it: `hf-compile` for the HF engine with
    /// torch.compile (`--hf-compile`: a configuration of its own, never folded with eager HF),
    /// else the engine.
    pub fn engine_label(&self) -> String {
        let compiled = self.engine_info.get("compile").is_some_and(|c| c == "true");
        match self.engine.as_str() {
            "hf" if compiled => "hf-compile".into(),
            e => e.into(),
        }
    }
}

/// The configuration an HF run ran, from its `engine_info`, as the console's candle / HF
/// tables name it: `attn=sdpa (best of eager 4.00 ms, sdpa 3.00 ms (2 probe batches)),
/// compile off`.
pub fn describe_hf_config(info: &std::collections::BTreeMap<String, String>) -> String {
    let attn = info.get("attn").map_or("?", String::as_str);
    let by = match (info.get("attn_chosen_by"), info.get("attn_requested")) {
        (Some(by), _) => format!(" ({by})"),
        (None, Some(asked)) if asked != attn => format!(" (--hf-attn {asked})"),
        _ => String::new(),
    };
    let compile = match info.get("compile").map(String::as_str) {
        Some("true") => "on",
        _ => "off",
    };
    format!("attn={attn}{by}, compile {compile}")
}

/// How a generation run generates: greedy, exactly `new_tokens` per prompt (no stop at EOS, so
/// the work is fixed), prompts left-padded to the longest of their batch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GenerationInfo {
    /// `lambada` (FasterTransformer's bloom_lambada: the passage's context, as many new tokens
    /// as the longest target of the batch, accuracy = generated ids equal the target's) or
    /// `text` (the generation suite: prompts of `prompt_len` tokens cut from the text).
    pub source: String,
    /// Fixed new tokens per prompt (`text`); None: per batch (`lambada`).
    pub new_tokens: Option<usize>,
    /// Prompt tokens (`text`).
    pub prompt_len: Option<usize>,
    /// Whether each token was timed (device synchronized after each): time to first token and
    /// inter-token latency; off, only whole calls are timed.
    pub timed_steps: bool,
    pub pad_id: u32,
    /// Banned from the generated ids (HF's `min_new_tokens` bans EOS).
    pub eos_ids: Vec<u32>,
}

/// One generation call: a batch of prompts continued by `new_tokens` tokens each.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GenBatchRecord {
    pub batch: usize,
    /// 0-based pass over the calls (`--min-time`); absent for the first. Later passes have no
    /// `passages`: accuracy is scored on the first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pass: usize,
    pub n_samples: usize,
    /// Longest prompt of the batch.
    pub prompt_len: usize,
    /// Length every prompt was left-padded to: `prompt_len` rounded up to `--pad-multiple`
    /// (None in older logs, which padded to `prompt_len`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padded_len: Option<usize>,
    /// Real prompt tokens of the batch.
    pub n_prompt_tokens: usize,
    pub new_tokens: usize,
    /// The whole call, device synchronized at both ends.
    pub latency_ms: f64,
    /// Time to first token (the prefill), ms; timed steps only.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Time between consecutive new tokens, ms; timed steps only.
    #[serde(default)]
    pub itl_ms: Vec<f64>,
    /// `lambada`: one per passage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passages: Vec<GenPassage>,
}

/// A LAMBADA passage generated: its ids, and whether they start with the target's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GenPassage {
    /// Line index in the data file.
    pub index: usize,
    pub correct: bool,
    pub generated: Vec<u32>,
}

/// A data-parallel run's group and batch rules, as rank 0 (the one that logs) saw it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DpInfo {
    pub size: usize,
    /// 0: every rank holds the whole optimizer state; 1: each holds its parameters' share.
    pub zero_stage: u8,
    /// `--dp-overlap`: each block's gradients all-reduced under the rest of the backward.
    #[serde(default)]
    pub overlap: bool,
    /// The all-reduce: `nccl X.Y.Z` or `tcp`.
    pub backend: String,
    pub launcher: String,
    pub ranks: Vec<crate::dist::Peer>,
    /// Blocks per optimizer step over all ranks: size × batch_size × grad_accum.
    pub global_batch_size: usize,
    /// How the batch and learning rate are set, in words.
    pub rules: String,
}

/// A tensor-parallel run's group, as rank 0 (the one that logs) saw it.
/// `dp`, `zero1`, `zero2` or `zero3`: a data-parallel run's strategy by its ZeRO level.
pub fn strategy_name(zero_stage: u8) -> String {
    match zero_stage {
        0 => "dp".into(),
        z => format!("zero{z}"),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TpInfo {
    pub size: usize,
    /// The all-reduce: `nccl X.Y.Z` (its version as loaded) or `tcp` (CPU ranks).
    pub backend: String,
    /// Who started the ranks: SelfSpawned, Torchrun, OpenMpi or Slurm.
    pub launcher: String,
    /// Every rank: host, pid, device, GPU name and UUID.
    pub ranks: Vec<crate::dist::Peer>,
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
    /// 0-based pass over the batches (`--min-time`); absent for the first. Later passes have
    /// no `passages`: accuracy and perplexity are scored on the first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pass: usize,
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
    /// `ok`; `oom` (out of memory), `error` or `killed` with `error` set: a run that failed
    /// after its header keeps the metrics of the batches it finished.
    pub status: RunStatus,
    pub error: Option<String>,
    /// Passages (prompts) of the first pass: what accuracy and perplexity are over.
    pub n_samples: usize,
    /// Timed batches and their real tokens, every pass.
    pub n_batches: usize,
    pub n_tokens: usize,
    /// Samples of every timed batch, every pass: what `samples_per_second` counts (None in
    /// older logs, which ran one pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_samples: Option<usize>,
    /// Passes over the batches the timed loop started (`--min-time`, `--min-batches`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passes: Option<usize>,
    /// lm-eval `acc`: see [`crate::metrics::lambada_accuracy`].
    #[serde(deserialize_with = "nan_if_null")]
    pub accuracy: f64,
    /// lm-eval `perplexity`: see [`crate::metrics::lambada_perplexity`].
    #[serde(deserialize_with = "nan_if_null")]
    pub perplexity: f64,
    /// Timed samples / timed seconds (the sum of batch latencies).
    #[serde(deserialize_with = "nan_if_null")]
    pub samples_per_second: f64,
    /// Real input tokens / timed seconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub tokens_per_second: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub latency_ms_p50: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub latency_ms_p90: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub latency_ms_p99: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub latency_ms_mean: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub latency_ms_stdev: f64,
    /// Sum of batch latencies, seconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub timed_seconds: f64,
    /// Whole run: load, warmup, timed batches, logging.
    #[serde(deserialize_with = "nan_if_null")]
    pub wall_seconds: f64,
    /// See [`crate::trackers::MemoryTracker`].
    pub peak_memory_bytes: u64,
    pub device_memory_used_bytes: Option<u64>,
    /// Peak resident set of the process (VmHWM): with safetensors checkpoints it includes the
    /// mapped file pages read, which the kernel can drop; with random weights no weights pass
    /// through the host.
    #[serde(default)]
    pub peak_host_memory_bytes: Option<u64>,
    /// CUDA: the pool's reserved high-water mark (see [`crate::trackers::MemoryReading`]).
    #[serde(default)]
    pub pool_reserved_bytes: Option<u64>,

    // GPU trackers over the timed batches (None on CPU, or where NVML could not tell); see
    // [`crate::trackers::GpuSampler`] and [`crate::trackers::EnergyTracker`].
    /// Peak device memory of the engine's process as NVML counts it, sampled every 10 ms:
    /// `peak_memory_bytes` (the engine's pool) + CUDA context and kernels + cuBLAS workspace +
    /// pool reserve. For `hf`, the worker's process.
    #[serde(default)]
    pub nvml_peak_process_memory_bytes: Option<u64>,
    /// Peak used memory of the whole GPU (every process), NVML.
    #[serde(default)]
    pub nvml_peak_device_memory_used_bytes: Option<u64>,
    #[serde(default)]
    pub sm_clock_mhz_median: Option<f64>,
    /// NVML "GPU utilization": percent of time a kernel ran.
    #[serde(default)]
    pub gpu_utilization_percent_median: Option<f64>,
    #[serde(default)]
    pub power_watts_mean: Option<f64>,
    #[serde(default)]
    pub gpu_samples: Option<usize>,
    /// NVML's energy counter over the timed loop (`energy_seconds` of wall time: the batches
    /// and the log writes between them).
    #[serde(default)]
    pub energy_joules: Option<f64>,
    #[serde(default)]
    pub energy_seconds: Option<f64>,
    /// energy_joules / timed samples.
    #[serde(default)]
    pub joules_per_sample: Option<f64>,

    /// Model FLOPs of the timed batches: [`crate::flops::lambada_forward_flops`] summed.
    #[serde(default)]
    pub model_flops: Option<f64>,
    /// model_flops / timed_seconds / 1e12.
    #[serde(default)]
    pub achieved_tflop_per_second: Option<f64>,
    /// The GPU's dense peak for the run's precision ([`crate::flops::PEAK_TFLOPS`]).
    #[serde(default)]
    pub peak_tflop_per_second: Option<f64>,
    /// achieved / peak, a fraction (0..1).
    #[serde(default)]
    pub mfu: Option<f64>,

    // Generation runs only (see [`crate::metrics::GenTotals`]).
    /// New tokens / timed seconds (every row of every timed call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_tokens_per_second: Option<f64>,
    /// Decode-phase tokens / decode seconds: rows · (N − 1) over the time after the first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_tokens_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms_p90: Option<f64>,
    /// Inter-token latency percentiles over every decode step of the timed calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms_p90: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms_p99: Option<f64>,
    /// Bytes of the KV cache of the largest call (candle; None where the engine does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_bytes: Option<u64>,
    /// Graph compilations inside the timed batches (compiled HF: torch.compile's, which then
    /// count in the figures; 0 where every shape compiled in the warm-up); None for engines
    /// that compile nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiles_timed: Option<u64>,
    /// 95 % bootstrap interval of `samples_per_second`: the timed batches resampled with
    /// replacement 1000 times (fixed seed), Σ samples / Σ latency of each resample
    /// ([`crate::metrics::bootstrap_ci95`]); None for fewer than 2 batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second_ci95_low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second_ci95_high: Option<f64>,
    /// The same interval of `latency_ms_p50`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p50_ci95_low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p50_ci95_high: Option<f64>,
    /// Timed batches whose latency a sample lies more than 3.5 robust standard deviations from
    /// the median ([`crate::metrics::mad_outliers`]); None for fewer than 3 batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_outliers: Option<u64>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// JSON has no NaN: serde_json writes it as `null` (a run that failed before its first
/// batch has no accuracy); read `null` back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
    use super::describe_hf_config;
    use std::collections::BTreeMap;

    fn info(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_hf_configuration_names_attention_how_it_was_chosen_and_compile() {
        let best = info(&[
            ("attn", "eager"),
            ("attn_requested", "best"),
            (
                "attn_chosen_by",
                "best of eager 1.00 ms, sdpa 2.00 ms (3 probe batches)",
            ),
            ("compile", "true"),
        ]);
        assert_eq!(
            describe_hf_config(&best),
            "attn=eager (best of eager 1.00 ms, sdpa 2.00 ms (3 probe batches)), compile on"
        );
        let auto = info(&[
            ("attn", "sdpa"),
            ("attn_requested", "auto"),
            ("compile", "false"),
        ]);
        assert_eq!(
            describe_hf_config(&auto),
            "attn=sdpa (--hf-attn auto), compile off"
        );
        // Logs from before --hf-attn best name the attention only.
        let old = info(&[("attn", "sdpa"), ("compile", "false")]);
        assert_eq!(describe_hf_config(&old), "attn=sdpa, compile off");
    }
}
