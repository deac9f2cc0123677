//! Engines run a model; scenarios decide what to run and score it. A scenario talks to an
//! engine through one small trait per capability ([`Score`] a LAMBADA batch, [`Generate`]
//! greedy continuations, [`Train`] a run of steps), on top of what every engine has ([`Engine`]: name, versions, load time, memory).
//! Both engines get the same token ids, batches and padding, and report per-token scores and a
//! latency measured with the same rule (device synchronized before each clock read), so the
//! Rust side computes every metric with one piece of code.
//!
//! - [`candle`]: this crate's models, in process.
//! - [`hf`]: HF transformers + PyTorch in a Python worker process.
//! - [`llmc`]: llm.c's `train_gpt2cu`, an external process (training only).
//! - [`weight_cache`]: the HF checkpoint both engines read when the weights are random.
//! - [`registry`]: which engines there are, what each runs, how each opens ([`args`]).
//! - [`replay`]: serving a whole load on the engine's own clock (the HF worker's serving), and
//!   the serving suite's [`replay::Batching`].

pub mod args;
pub mod candle;
pub mod hf;
pub mod llmc;
pub mod registry;
pub mod replay;
pub mod weight_cache;

use crate::error::{Error, Result};
use crate::trackers::{MemoryReading, StepClock};
use crate::train::StepOutcome;
use std::collections::BTreeMap;
use std::path::Path;

/// Which engine(s) a run uses (`--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// This crate's models in candle.
    Candle,
    /// HF transformers + PyTorch (Python worker).
    Hf,
    /// Candle, then HF on the same weights and data, with a side-by-side summary.
    Both,
    /// llm.c's train_gpt2cu (training suites only), an external binary.
    Llmc,
}

impl EngineKind {
    /// The flag's spelling (`candle`, `hf`, `both`, `llmc`), as logged and as sweep configurations
    /// name it.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Candle => "candle",
            EngineKind::Hf => "hf",
            EngineKind::Both => "both",
            EngineKind::Llmc => "llmc",
        }
    }
}

/// What every engine has, whatever it runs.
pub trait Engine {
    /// `candle`, `hf` or `llmc`, as logged.
    fn name(&self) -> &'static str;
    /// Versions and settings recorded in the log header (library versions, attention kind…).
    fn info(&self) -> BTreeMap<String, String>;
    /// Seconds the weights took to load.
    fn load_seconds(&self) -> f64;
    /// The process that holds the GPU memory (this one, or a worker's), for NVML.
    fn pid(&self) -> u32 {
        std::process::id()
    }
    /// Ends the run; returns the peak memory (see [`crate::trackers::MemoryTracker`]).
    fn finish(&mut self) -> Result<MemoryReading>;
    /// Graph compilations so far (compiled HF: torch.compile's); None where the engine
    /// compiles nothing. The scenarios log how many fell inside the timed batches.
    fn compiles(&self) -> Option<u64> {
        None
    }
    /// The CUDA device's UUID where the engine holds one in this process (NVML's view of it).
    fn cuda_uuid(&self) -> Option<String> {
        None
    }
}

/// One tokenized LAMBADA passage, ready to batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Line index in the data file.
    pub index: usize,
    pub context_tokens: Vec<u32>,
    pub target_tokens: Vec<u32>,
    /// What the model reads: (context + target) truncated on the left, minus the last token.
    pub input: Vec<u32>,
}

/// What an engine returns for a batch: for every passage in order, one entry per target
/// token: its log-probability (natural log, computed in fp32) and the argmax token id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetScores {
    pub token_ll: Vec<f32>,
    pub argmax: Vec<u32>,
}

/// One batch's scores and the engine's own measurement of it.
pub struct BatchOutput {
    pub scores: TargetScores,
    /// Milliseconds, device synchronized at both ends: ids to the device, forward, LM head on the
    /// target rows, log-softmax in fp32, results back on the host.
    pub latency_ms: f64,
}

/// Capability: score right-padded batches of [`Request`]s (LAMBADA).
pub trait Score: Engine {
    /// Longest input the model takes.
    fn max_positions(&self) -> usize;
    /// Scores `batch`, every row right-padded to `padded_len` positions (at least its longest
    /// input; the scenario decides, so that every engine pads alike).
    fn score(&mut self, batch: &[Request], padded_len: usize) -> Result<BatchOutput>;
    /// Before the warm-up, an engine with settings to choose between (HF's attention and
    /// torch.compile, `--hf-attn best` / `--hf-compile best`) times each on `probe` (batches
    /// with their padded lengths) and keeps the one cheapest for the run, a share `cold_share`
    /// of whose timed batches meet a shape the warm-up did not; it says so in
    /// [`Engine::info`]. The others have nothing to choose.
    fn choose_config(&mut self, _probe: &[(&[Request], usize)], _cold_share: f64) -> Result<()> {
        Ok(())
    }
}

/// One optimizer step as an engine measured it: the trainer's [`StepOutcome`] and the latency
/// timed around it. The scenario logs it as a [`crate::record::StepRecord`].
pub struct TimedStep {
    pub outcome: StepOutcome,
    /// Device synchronized at both ends: ids to the device, forward, backward, clipping,
    /// optimizer update.
    pub latency_ms: f64,
}

/// The scenario's side of a training run ([`Train::train`]): it hands out each step's
/// micro-batches and logs each step as it ends.
pub trait StepBook<'a> {
    /// This rank's micro-batches of the next optimizer step (each a list of blocks; gradient
    /// accumulation when more than one); None after the last step.
    fn next_step(&mut self) -> Option<Vec<Vec<&'a [u32]>>>;
    /// Logs the step [`StepBook::next_step`] gave last.
    fn step_done(&mut self, step: TimedStep) -> Result<()>;
}

/// What a training run does after its steps, where none failed: the scenario decides, the
/// engine does it, in this order.
pub struct AfterSteps<'a> {
    /// Data parallelism: each rank's peak memory over the steps (bytes) gathered to every rank
    /// (a collective: every rank calls it).
    pub gather_peaks: Option<&'a dyn Fn(u64) -> Result<Vec<u64>>>,
    /// Mean next-token loss per block over these blocks in batches of this size (no dropout,
    /// no gradients): rank 0's, or every rank's where the evaluation is a collective.
    pub eval: Option<(&'a [Vec<u32>], usize)>,
    /// Write the trained fp32 weights here as an HF checkpoint (`--save`, rank 0).
    pub save: Option<&'a Path>,
    /// Read the peak memory after a failure too: the engine runs in this process (a dead
    /// worker has no memory to report).
    pub memory_after_failure: bool,
}

/// What a training run left besides its logged steps.
pub struct Trained {
    /// The error of the step or evaluation that ended the run early.
    pub failure: Option<Error>,
    /// Every rank's peak over the steps ([`AfterSteps::gather_peaks`]).
    pub per_rank_peak: Option<Vec<u64>>,
    /// The evaluation's loss and its runtime in seconds.
    pub eval: Option<(f64, f64)>,
    /// The peak memory as the run ends.
    pub memory: MemoryReading,
}

/// Capability: train on blocks of token ids of equal length (WikiText-2). The engine drives the
/// run: each step `book` hands out, reported back to it as the step ends (a failing step ends
/// the steps), then what `after` asks.
pub trait Train: Engine {
    fn train<'a>(&mut self, book: &mut dyn StepBook<'a>, after: &AfterSteps) -> Result<Trained>;
    /// Whether the engine applies the model's dropout when the run asks for it (the header's
    /// `dropout` is what was trained, not what was asked).
    fn applies_dropout(&self) -> bool {
        true
    }
}

/// An engine that trains one call at a time from here (the HF worker's ops, llm.c's output
/// lines): [`train_stepwise`] makes its [`Train::train`].
pub trait Stepwise: Engine {
    /// One optimizer step over `micro_batches`.
    fn step(&mut self, micro_batches: &[Vec<&[u32]>]) -> Result<TimedStep>;
    /// Mean next-token loss per block over `blocks` in batches of `batch_size`, and its
    /// runtime in seconds.
    fn eval(&mut self, blocks: &[Vec<u32>], batch_size: usize) -> Result<(f64, f64)>;
    /// Writes the trained fp32 weights as an HF checkpoint.
    fn save(&self, dir: &Path) -> Result<()>;
}

/// [`Train::train`] of a [`Stepwise`] engine: the steps, then the peaks gathered, the
/// evaluation, the save and the memory, as `after` asks (the candle engine's sequence, which
/// it runs on its trainer itself).
pub fn train_stepwise<'a, E: Stepwise + ?Sized>(
    engine: &mut E,
    book: &mut dyn StepBook<'a>,
    after: &AfterSteps,
) -> Result<Trained> {
    let mut failure = None;
    while let Some(micro) = book.next_step() {
        match engine.step(&micro) {
            Ok(step) => book.step_done(step)?,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let per_rank_peak = match (after.gather_peaks, &failure) {
        (Some(gather), None) => Some(gather(engine.finish().map(|m| m.peak_bytes).unwrap_or(0))?),
        _ => None,
    };
    let mut eval = None;
    if let (Some((blocks, batch_size)), None) = (after.eval, &failure) {
        match engine.eval(blocks, batch_size) {
            Ok(r) => eval = Some(r),
            Err(e) => failure = Some(e),
        }
    }
    if let (Some(dir), None) = (after.save, &failure) {
        engine.save(dir)?;
        saved_note(dir);
    }
    let memory = match failure.is_some() && !after.memory_after_failure {
        true => MemoryReading::default(),
        false => memory_or_warning(engine.finish()),
    };
    Ok(Trained {
        failure,
        per_rank_peak,
        eval,
        memory,
    })
}

/// Says where `--save` wrote the trained weights.
pub fn saved_note(dir: &Path) {
    eprintln!(
        "saved trained weights to {} (config.json + model.safetensors, fp32)",
        dir.display()
    );
}

/// An engine's memory reading; a failed query costs the figure, with a warning, not the run.
pub fn memory_or_warning(reading: Result<MemoryReading>) -> MemoryReading {
    reading.unwrap_or_else(|e| {
        eprintln!("warning: memory tracking failed: {e}");
        MemoryReading::default()
    })
}

/// One untimed call of a capability: what a scenario's warm-up runs (CUDA loads candle's PTX
/// kernels, cuBLAS creates handles, the memory pools grow, a compiled HF model compiles the
/// shape).
pub trait WarmUp<E: ?Sized> {
    fn warm_up(&self, engine: &mut E) -> Result<()>;
}

/// A scoring batch and the length it is padded to.
impl WarmUp<dyn Score> for (&[Request], usize) {
    fn warm_up(&self, engine: &mut (dyn Score + 'static)) -> Result<()> {
        engine.score(self.0, self.1).map(drop)
    }
}

/// A generation call and whether its clock takes a lap at each token.
impl WarmUp<dyn Generate> for (GenerateRequest<'_>, bool) {
    fn warm_up(&self, engine: &mut (dyn Generate + 'static)) -> Result<()> {
        let mut clock = StepClock::new(self.1);
        engine.generate(&self.0, &mut clock).map(drop)
    }
}

/// A batch of prompts to continue greedily by exactly `new_tokens` tokens each.
pub struct GenerateRequest<'a> {
    /// Token ids of each prompt, left-padded by the engine to `padded_len`.
    pub prompts: &'a [Vec<u32>],
    /// Positions every prompt is left-padded to (at least the longest prompt).
    pub padded_len: usize,
    pub new_tokens: usize,
    /// The id padding takes (GPT-2: its EOS, as HF's examples set `pad_token_id`).
    pub pad_id: u32,
    /// Never generated: HF's `min_new_tokens = new_tokens` bans the EOS ids for every step.
    pub eos_ids: &'a [u32],
}

/// Capability: greedy generation with a KV cache.
pub trait Generate: Engine {
    /// Longest prompt + new tokens the model takes.
    fn max_positions(&self) -> usize;
    /// `new_tokens` ids per prompt. The call is timed on `clock` (device synchronized at both
    /// ends: ids to the device, prefill, every decode step, the ids back on the host), with a
    /// lap at each new token where the clock asks for laps (time to first token, inter-token
    /// latency).
    fn generate(&mut self, req: &GenerateRequest, clock: &mut StepClock) -> Result<Vec<Vec<u32>>>;
    /// As [`Score::choose_config`], on generation calls.
    fn choose_config(&mut self, _probe: &[GenerateRequest], _cold_share: f64) -> Result<()> {
        Ok(())
    }
    /// Bytes of the KV cache the last call used (None where the engine does not say).
    fn kv_cache_bytes(&self) -> Option<u64> {
        None
    }
    /// Continuous batching ([`InFlight`]), where the engine has it.
    fn in_flight(&mut self) -> Option<&mut dyn InFlight> {
        None
    }
}

/// Capability: continuous (in-flight) batching, as a server schedules it: slots that requests
/// join (their prompt prefilled, one at a time) and leave between decode steps, each decode
/// step one forward of every occupied slot. Greedy, the EOS ids banned, as [`Generate`].
/// Every call returns with its tokens on the host (the device done), so the caller's clock
/// reads each token's time.
pub trait InFlight {
    /// Makes `slots` empty slots for requests of at most `longest` positions (prompt + output
    /// tokens); free slots run `pad_id`; `eos_ids` are never generated. Replaces earlier slots.
    fn open_slots(
        &mut self,
        slots: usize,
        longest: usize,
        pad_id: u32,
        eos_ids: &[u32],
    ) -> Result<()>;
    /// Prefills `prompt` into the free slot `slot`; returns its first token.
    fn join(&mut self, slot: usize, prompt: &[u32]) -> Result<u32>;
    /// One decode step of every occupied slot; returns (slot, next token) for each.
    fn step(&mut self) -> Result<Vec<(usize, u32)>>;
    /// Frees `slot` at once.
    fn leave(&mut self, slot: usize) -> Result<()>;
    /// How the engine batches, for the log header's `batching` (after `continuous: `).
    fn describe(&self) -> String;
}
