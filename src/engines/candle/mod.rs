//! The candle engine: this crate's models, in process.
//!
//! - [`CandleEngine`] scores LAMBADA batches ([`score`]).
//! - [`CandleTrainer`] trains ([`train`], on [`crate::train::Trainer`]).

pub mod generate;
pub mod score;
pub mod train;

pub use score::target_scores;
pub use train::CandleTrainer;

use crate::device::{synchronize, Precision};
use crate::dist::Tp;
use crate::error::Result;
use crate::models::weights::save_checkpoint;
use crate::models::{CausalLm, KvCache, ModelSpec, Recorder, WeightSource};
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

impl CandleEngine {
    /// Loads `model` (this rank's shard with `tp`) on `device` in `precision`; with `save`,
    /// also writes the random weights there as an HF checkpoint.
    pub fn load(
        model: &ModelSpec,
        weights: &WeightSource,
        precision: Precision,
        device: Device,
        tp: Option<&Tp>,
        save: Option<&Path>,
    ) -> Result<Self> {
        precision.apply_matmul_mode(&device);
        let memory = memory_tracker(&device);
        let dtype = precision.dtype();
        let record = save.map(|_| Recorder::default());
        let load = Instant::now();
        let loaded = match tp {
            Some(group) => model.load_shard(weights, dtype, &device, group)?,
            None => model.load_recording(weights, dtype, &device, record.clone())?,
        };
        synchronize(&device)?;
        let load_seconds = load.elapsed().as_secs_f64();
        if let (Some(dir), Some(record)) = (save, record) {
            let tensors = std::mem::take(&mut *record.lock().expect("recorder lock"));
            save_checkpoint(dir, &model.hf_config(dtype), tensors)?;
            eprintln!(
                "saved weights to {} (config.json + model.safetensors)",
                dir.display()
            );
        }
        Ok(Self {
            model: loaded,
            device,
            memory,
            load_seconds,
            cache: None,
        })
    }
}
