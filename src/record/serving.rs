//! The serving suite's records (`--suite serving`): the header's [`ServingInfo`] (the load and
//! how requests were batched), one [`RequestRecord`] per timed request as its batch ends, and
//! the [`ServingSummary`] that closes the log. Times are milliseconds on the scenario's clock:
//! wall time from the end of the warm-up, when the first request may arrive.

use super::status::RunStatus;
use serde::{Deserialize, Serialize};

/// JSON has no NaN: serde_json writes it as `null` (a run that served nothing has no
/// latencies); read `null` back as NaN (as `crate::record`'s own records do).
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The load a serving run put on the engine, and how it batched it (in the log header).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ServingInfo {
    /// Timed requests (after the untimed warm-up calls).
    pub num_requests: usize,
    /// `--request-rate`, requests/s; None: infinite (every request scheduled at 0).
    pub request_rate: Option<f64>,
    /// `--burstiness`: the gamma shape of the inter-arrival times (1: Poisson).
    pub burstiness: f64,
    /// `--max-concurrency`: requests in flight at most (closed loop); None: open loop.
    pub max_concurrency: Option<usize>,
    /// Prompt and output lengths in tokens, inclusive ranges (min = max: fixed).
    pub input_len: (usize, usize),
    pub output_len: (usize, usize),
    /// Seed of the arrival times, the lengths and the prompts' random ids (`--seed`).
    pub seed: u64,
    /// Prompts are random token ids (no EOS, no pad); outputs are exactly `output_len` tokens.
    pub prompts: String,
    /// How arrived requests reach the engine.
    pub batching: String,
    /// The clock the times are on.
    pub clock: String,
    /// `--slo`: the goodput's limits, ms (None: not asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_tpot_ms: Option<f64>,
}

/// One request as served; every time in ms on the scenario's clock, ordered
/// `scheduled_ms ≤ arrival_ms ≤ start_ms ≤ first_token_ms ≤ finish_ms`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RequestRecord {
    /// 0-based, in schedule order.
    pub request: usize,
    /// 0-based index of the engine call (batch) that served it (continuous batching: of the
    /// first decode step it took part in; transformers' manager, whose steps are not counted:
    /// its admission into the running batch, in start order).
    pub batch: usize,
    /// Requests of that batch (continuous batching: running once it joined, itself included).
    pub batch_size: usize,
    /// When the arrival process scheduled it.
    pub scheduled_ms: f64,
    /// When it entered the queue: `scheduled_ms`, or later where `--max-concurrency` held it
    /// until a request in flight finished.
    pub arrival_ms: f64,
    /// When its batch's engine call began (continuous batching: its prefill; transformers'
    /// manager: it left the waiting queue).
    pub start_ms: f64,
    /// Its first output token (the end of the batch's prefill, or of its own).
    pub first_token_ms: f64,
    /// Every output token, in order (`output_len` of them; the first is `first_token_ms`).
    pub token_ms: Vec<f64>,
    /// When the engine call returned (static batching: the whole batch at once; continuous
    /// batching: the request's own end, its last token as it left the running batch).
    pub finish_ms: f64,
    pub input_len: usize,
    pub output_len: usize,
}

/// The end of a serving run: rates over the run's duration, latency percentiles over its
/// requests ([`crate::metrics::serving`] defines each).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ServingSummary {
    pub status: RunStatus,
    pub error: Option<String>,
    /// Requests served (all of them, unless the run failed).
    pub n_requests: usize,
    /// Engine calls (continuous batching: decode steps; transformers' manager, whose steps
    /// are not counted: admissions, one a request).
    pub n_batches: usize,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    /// From the clock's 0 to the last request's finish, seconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub duration_seconds: f64,
    /// Requests / duration.
    #[serde(deserialize_with = "nan_if_null")]
    pub requests_per_second: f64,
    /// Output tokens / duration.
    #[serde(deserialize_with = "nan_if_null")]
    pub output_tokens_per_second: f64,
    /// Requests meeting `--slo` / duration (None without `--slo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput_requests_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_met_requests: Option<usize>,
    /// Mean requests per engine call (continuous batching: occupied slots per decode step;
    /// NaN, logged as null, where the steps are not counted: transformers' manager).
    #[serde(deserialize_with = "nan_if_null")]
    pub batch_size_mean: f64,
    pub ttft_ms: Percentiles,
    /// Per request over its output tokens after the first (requests of one token have none).
    pub tpot_ms: Percentiles,
    /// Every gap between consecutive output tokens of every request.
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    /// Time from arrival to the start of its batch.
    pub queue_ms: Percentiles,
    /// Whole run: load, warm-up, the served requests, logging.
    #[serde(deserialize_with = "nan_if_null")]
    pub wall_seconds: f64,
    /// See [`crate::trackers::MemoryTracker`].
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub peak_host_memory_bytes: Option<u64>,
}

/// Mean and percentiles of one latency, ms (NaN, logged as null, where there is no value).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p50: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p90: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p99: f64,
}
