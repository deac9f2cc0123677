//! The candle engine: this crate's models, in process.
//!
//! - [`CandleEngine`] scores LAMBADA batches ([`score`]), generates ([`generate`]) and
//!   batches continuously for the serving suite ([`in_flight`]); what they share (the
//!   [`Engine`] trait: name, versions, memory) is here.
//! - [`CandleTrainer`] trains ([`train`], on [`crate::train::Trainer`]).

pub mod generate;
pub mod in_flight;
pub mod score;
pub mod train;

pub use score::target_scores;
pub use train::CandleTrainer;

use crate::device::{synchronize, Precision};
use crate::dist::Tp;
use crate::engines::Engine;
use crate::error::Result;
use crate::models::slots::Slots;
use crate::models::weights::save_checkpoint;
use crate::models::{CausalLm, KvCache, ModelSpec, Recorder, WeightSource};
use crate::progress::{rate, Status};
use crate::trackers::{MemoryReading, MemoryTracker};
use candle_core::Device;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// A loaded model on its device, for inference.
pub struct CandleEngine {
    pub model: Box<dyn CausalLm>,
    pub device: Device,
    pub memory: Option<MemoryTracker>,
    pub load_seconds: f64,
    /// Generation: the KV cache, kept between calls (a new one only when a call needs more
    /// rows or positions than it has).
    pub cache: Option<KvCache>,
    /// Continuous batching: the slots requests join and leave (made by `open_slots`).
    pub slots: Option<Slots>,
    /// Whether scoring runs the batch's passages end to end without padding (the fused
    /// attention applies: [`crate::kernels::prefill_applies`]); the log header says so.
    pub packs: bool,
    /// Whether the model's weights are laid out for decoding ([`CausalLm::prepare_decode`]):
    /// at the first generation that the GEMV or the tensor-core projections take on CUDA (at
    /// most [`crate::kernels::GEMV_MAX_ROWS`] or [`crate::kernels::SKINNY_MAX_ROWS`] rows), so
    /// that scoring before it keeps the layout its matmuls were measured in.
    pub laid_out_for_decode: bool,
}

/// What every capability of the engine shares (scoring, generation): its name, versions,
/// load time and memory.
impl Engine for CandleEngine {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn info(&self) -> BTreeMap<String, String> {
        let mut info = engine_info(&self.device);
        if self.packs {
            let how = "packed: each batch's passages end to end, no padding";
            info.insert("scoring".into(), how.into());
        }
        info
    }

    fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        read_memory(&self.memory)
    }

    fn cuda_uuid(&self) -> Option<String> {
        crate::device::cuda_uuid(&self.device)
    }
}

/// What the candle engine records in a log header: its version and, on CUDA, which fused
/// kernels are on.
pub fn engine_info(device: &Device) -> BTreeMap<String, String> {
    let mut info = BTreeMap::from([("candle".to_string(), "0.11.1".to_string())]);
    if device.is_cuda() {
        info.insert("fused".into(), crate::kernels::describe());
    }
    info
}

/// Starts tracking `device`'s memory; a failed query costs the memory figure, not the run.
pub fn memory_tracker(device: &Device) -> Option<MemoryTracker> {
    MemoryTracker::start(device)
        .inspect_err(|e| eprintln!("warning: memory tracking unavailable: {e}"))
        .ok()
}

/// The engine's memory reading, or zeros where it is not tracked.
fn read_memory(memory: &Option<MemoryTracker>) -> Result<MemoryReading> {
    match memory {
        Some(m) => m.read(),
        None => Ok(MemoryReading::default()),
    }
}

/// Where a candle engine's weights come from and what it shows while loading them.
pub struct LoadFrom<'a> {
    pub weights: &'a WeightSource,
    /// This rank's shard of a tensor-parallel group.
    pub tp: Option<&'a Tp>,
    /// Also write the random weights here as an HF checkpoint (`--save-weights`).
    pub save: Option<&'a Path>,
    /// A byte bar (or lines) on stderr while loading.
    pub progress: bool,
}

impl CandleEngine {
    /// Loads `model` from `from` on `device` in `precision`.
    pub fn load(
        model: &ModelSpec,
        from: LoadFrom,
        precision: Precision,
        device: Device,
    ) -> Result<Self> {
        let LoadFrom {
            weights,
            tp,
            save,
            progress,
        } = from;
        precision.apply_matmul_mode(&device);
        let memory = memory_tracker(&device);
        let dtype = precision.dtype();
        let record = save.map(|_| Recorder::default());
        // A rank reads only its slices: a count without a total.
        let total = match tp {
            Some(_) => None,
            None => Some(weights.payload_bytes(model.n_parameters(), dtype)?),
        };
        let what = format!("{} ({}) in {precision}", model.name, weights.describe());
        let status = Status::bytes(progress, total, format!("loading weights: {what}"));
        let load = Instant::now();
        let mut loaded = match tp {
            Some(group) => {
                model.load_shard_watched(weights, dtype, &device, group, status.bar())?
            }
            None => model.load_watched(weights, dtype, &device, record.clone(), status.bar())?,
        };
        if precision == Precision::Fp8 {
            loaded.quantize_fp8()?;
        }
        synchronize(&device)?;
        let load_seconds = load.elapsed().as_secs_f64();
        let bytes = status.bar().position();
        status.done(format!("loaded weights: {}", rate(bytes, load.elapsed())));
        if let (Some(dir), Some(record)) = (save, record) {
            let tensors = std::mem::take(&mut *record.lock().expect("recorder lock"));
            save_checkpoint(dir, &model.hf_config(dtype), tensors)?;
            eprintln!(
                "saved weights to {} (config.json + model.safetensors)",
                dir.display()
            );
        }
        let packs = crate::kernels::prefill_applies(dtype, &device, model.head_size());
        Ok(Self {
            model: loaded,
            device,
            memory,
            load_seconds,
            cache: None,
            slots: None,
            packs,
            laid_out_for_decode: false,
        })
    }
}
