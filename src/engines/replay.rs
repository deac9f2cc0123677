//! Capability: serve a whole load on the engine's own clock ([`Replay`]); the serving suite's
//! [`Batching`]. The serving suite drives an in-process engine step by step or call by call
//! ([`super::InFlight`] slots, [`super::Generate`]; its queue on this process's clock); an
//! engine in another process (the HF worker) is handed the whole load instead —
//! each request's scheduled arrival, prompt and output length, the batch cap, the closed
//! loop's concurrency — and replays it after an untimed warm-up, on a clock of its own that
//! starts at the first scheduled arrival. It returns raw times per request; the scenario
//! checks them and makes the log's records, so both ways of serving share one schema and one
//! set of formulas.

use super::{Generate, GenerateRequest};
use crate::error::{Error, Result};
use serde::Deserialize;

/// How requests share the engine (`--batching`): the serving suite's one notion of batching,
/// whether the scenario schedules it here or the engine replays the load itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    /// Requests join and leave the running batch between decode steps (the candle engine's
    /// slots, [`super::InFlight`]; transformers' `ContinuousBatchingManager`, a paged KV cache).
    Continuous,
    /// The arrived requests (up to the batch cap) as one generation call, the next call when
    /// it returns.
    Static,
}

impl Batching {
    /// `continuous` or `static`; `what` names the flag or key in the one-line error.
    pub fn parse(text: &str, what: &str) -> Result<Self> {
        match text.trim() {
            "continuous" => Ok(Self::Continuous),
            "static" => Ok(Self::Static),
            _ => Err(Error::Config(format!(
                "{what} '{text}': give continuous or static"
            ))),
        }
    }

    /// As the worker's protocol and `--batching` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Continuous => "continuous",
            Self::Static => "static",
        }
    }
}

/// The engine's choice of [`Batching`] and why (a fallback says what the model lacks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeChoice {
    pub mode: Batching,
    pub why: String,
}

/// One request of a replayed load.
#[derive(Clone, Copy, Debug)]
pub struct ReplayRequest<'a> {
    /// When the arrival process sends it, ms from the clock's 0.
    pub scheduled_ms: f64,
    pub prompt: &'a [u32],
    /// Exactly this many new tokens (greedy, EOS never ends it).
    pub output_len: usize,
}

/// A whole load, with the rules the scenario's queue follows.
pub struct ReplayLoad<'a> {
    /// In schedule order (request i is `requests[i]`).
    pub requests: Vec<ReplayRequest<'a>>,
    /// Requests per call at most (`--batch-size`; continuous batching: in the running batch).
    pub max_batch: usize,
    /// Requests in flight at most (`--max-concurrency`, closed loop): a request enters at its
    /// scheduled time or, when this many are in flight, when one finishes.
    pub max_concurrency: Option<usize>,
    /// The untimed warm-up: this call (its prompts, new tokens, pad and EOS ids), `warm_calls`
    /// times, before the clock starts.
    pub warm: GenerateRequest<'a>,
    pub warm_calls: usize,
    /// A static call's prompts are left-padded to the longest rounded up to this multiple,
    /// at most `pad_cap` (the scenario's padding, as in the in-process path).
    pub pad_multiple: usize,
    pub pad_cap: usize,
}

/// One request as the engine served it: ms on the engine's clock.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ReplayedRequest {
    /// Index into [`ReplayLoad::requests`].
    pub request: usize,
    /// The engine call that served it (continuous batching: its admission, in start order).
    pub batch: usize,
    /// Requests of that call (continuous batching: in the running batch as it joined, itself
    /// included).
    pub batch_size: usize,
    pub arrival_ms: f64,
    pub start_ms: f64,
    /// Every output token.
    pub token_ms: Vec<f64>,
    pub finish_ms: f64,
}

/// What a replay returned: every request served (in the order served), the calls made, and
/// the error that stopped it early (the requests served before it are kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Replayed {
    pub mode: Batching,
    pub requests: Vec<ReplayedRequest>,
    /// Engine calls (static); continuous batching: admissions, one a request.
    pub n_batches: usize,
    pub failure: Option<String>,
}

/// Capability: replay a serving load on the engine's own clock (an engine in another
/// process, where a call-by-call queue here would time the pipe too).
pub trait Replay: Generate {
    /// Chooses how the load will be batched (`max_batch` requests at most; `pad_id` pads,
    /// `eos_ids` are never generated), before the log's header is written: the header names it.
    /// `want`: continuous where the engine has it for this model (else static, saying why);
    /// static: static.
    fn replay_mode(
        &mut self,
        want: Batching,
        max_batch: usize,
        pad_id: u32,
        eos_ids: &[u32],
    ) -> Result<ModeChoice>;
    /// Warms up, then replays `load` as [`Replay::replay_mode`] chose.
    fn replay(&mut self, load: &ReplayLoad) -> Result<Replayed>;
}

/// An engine ready to serve: driven call by call from here, or replaying the whole load.
pub enum Server {
    Calls(Box<dyn Generate>),
    Replays(Box<dyn Replay>),
}

impl Server {
    /// The engine's generation capability (the warm-up, its name, info and memory).
    pub fn generate(&mut self) -> &mut dyn Generate {
        match self {
            Server::Calls(e) => e.as_mut(),
            Server::Replays(e) => e.as_mut(),
        }
    }
}
