//! The candle engine's training: [`crate::train::Trainer`] on an opened device, behind the
//! [`Train`] capability.

use super::{engine_info, memory_tracker, read_memory};
use crate::device::{synchronize, Precision};
use crate::engines::{Engine, TimedStep, Train};
use crate::error::Result;
use crate::models::weights::save_checkpoint;
use crate::models::{ModelSpec, WeightSource};
use crate::record::Hyper;
use crate::trackers::{LatencyTracker, MemoryReading, MemoryTracker};
use crate::train::{Backward, DataParallel, Trainer};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// The candle trainer on an opened device.
pub struct CandleTrainer {
    pub trainer: Trainer,
    spec: ModelSpec,
    device: Device,
    memory: Option<MemoryTracker>,
    load_seconds: f64,
}

/// How a candle training run is set up.
pub struct TrainSetup<'a> {
    pub model: &'a ModelSpec,
    pub weights: &'a WeightSource,
    pub precision: Precision,
    pub hyper: &'a Hyper,
    pub dropout: bool,
    /// `--backward`; None: the model's default ([`Backward::default_for`]).
    pub backward: Option<Backward>,
    /// `--recompute`: checkpoint each block of the manual step.
    pub recompute: bool,
    pub seed: u64,
    /// This rank's data-parallel group (`--dp`).
    pub dp: Option<DataParallel>,
}

impl CandleTrainer {
    /// Builds the trainer (fp32 masters, optimizer state) on `device`.
    pub fn start(setup: TrainSetup, device: Device) -> Result<Self> {
        setup.precision.apply_matmul_mode(&device);
        crate::kernels::set_dropout_seed(setup.seed);
        let memory = memory_tracker(&device);
        let load = Instant::now();
        let mut trainer = Trainer::new(
            setup.model,
            setup.weights,
            setup.precision.dtype(),
            &device,
            setup.hyper.clone(),
            setup.dropout,
        )?;
        if let Some(backward) = setup.backward {
            trainer.set_backward(backward)?;
        }
        trainer.set_recompute(setup.recompute)?;
        if let Some(dp) = setup.dp {
            trainer.set_data_parallel(dp)?;
        }
        synchronize(&device)?;
        Ok(Self {
            trainer,
            spec: setup.model.clone(),
            device,
            memory,
            load_seconds: load.elapsed().as_secs_f64(),
        })
    }
}

/// (B, T) u32 on `device` from equal-length blocks.
pub fn batch_tensor(blocks: &[&[u32]], device: &Device) -> Result<Tensor> {
    let t = blocks[0].len();
    let flat: Vec<u32> = blocks.iter().flat_map(|b| b.iter().copied()).collect();
    Ok(Tensor::from_vec(flat, (blocks.len(), t), device)?)
}

impl Engine for CandleTrainer {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn info(&self) -> BTreeMap<String, String> {
        let mut info = engine_info(&self.device);
        info.insert("backward".into(), self.trainer.backward().as_str().into());
        let recompute = if self.trainer.recompute() {
            "blocks"
        } else {
            "off"
        };
        info.insert("recompute".into(), recompute.into());
        info
    }

    fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        read_memory(&self.memory)
    }
}

impl Train for CandleTrainer {
    fn step(&mut self, micro_batches: &[Vec<&[u32]>]) -> Result<TimedStep> {
        let _profiled = crate::profile::window(&self.device);
        let mut lat = LatencyTracker::new(&self.device);
        lat.start()?;
        let micro = micro_batches
            .iter()
            .map(|b| batch_tensor(b, &self.device))
            .collect::<Result<Vec<_>>>()?;
        let outcome = self.trainer.step(&micro)?;
        Ok(TimedStep {
            outcome,
            latency_ms: lat.stop_ms()?,
        })
    }

    fn eval(&mut self, blocks: &[Vec<u32>], batch_size: usize) -> Result<(f64, f64)> {
        let batches = blocks
            .chunks(batch_size.max(1))
            .map(|c| {
                let rows: Vec<&[u32]> = c.iter().map(Vec::as_slice).collect();
                batch_tensor(&rows, &self.device)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut lat = LatencyTracker::new(&self.device);
        lat.start()?;
        let loss = self.trainer.eval_loss(&batches)?;
        Ok((loss, lat.stop_ms()? / 1e3))
    }

    fn save(&self, dir: &Path) -> Result<()> {
        save_checkpoint(
            dir,
            &self.spec.hf_config(DType::F32),
            self.trainer.named_params()?,
        )
    }
}
