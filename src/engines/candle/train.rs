//! The candle engine's training: [`crate::train::Trainer`] on an opened device, behind the
//! [`Train`] capability: the run's steps, its evaluation and its memory, driven here.

use super::{engine_info, memory_tracker, read_memory};
use crate::device::{synchronize, Precision};
use crate::engines::{
    memory_or_warning, saved_note, AfterSteps, Engine, StepBook, TimedStep, Train, Trained,
};
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
    /// What the log header records ([`Engine::info`]), known once the trainer is set up.
    info: BTreeMap<String, String>,
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
    /// `--recompute`: what the manual step keeps of each block.
    pub recompute: crate::train::Recompute,
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
        let load_seconds = load.elapsed().as_secs_f64();
        let mut info = engine_info(&device);
        info.insert("backward".into(), trainer.backward().as_str().into());
        info.insert("recompute".into(), trainer.recompute().as_str().into());
        Ok(Self {
            trainer,
            spec: setup.model.clone(),
            device,
            memory,
            load_seconds,
            info,
        })
    }

    /// One optimizer step over `micro_batches` (gradient accumulation when more than one).
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

    /// Mean next-token loss per block over `blocks` in batches of `batch_size` (no dropout, no
    /// gradients), and its runtime in seconds.
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

    /// Writes the trained fp32 weights as an HF checkpoint.
    fn save(&self, dir: &Path) -> Result<()> {
        save_checkpoint(
            dir,
            &self.spec.hf_config(DType::F32),
            self.trainer.named_params()?,
        )
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
        self.info.clone()
    }

    fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        read_memory(&self.memory)
    }
}

/// The steps, then the peaks gathered, the evaluation, the save and the memory, as `after`
/// asks: the sequence [`crate::engines::train_stepwise`] runs for the engines trained from
/// outside, written out here so that the trainer's calls stay in this file.
impl Train for CandleTrainer {
    fn train<'a>(&mut self, book: &mut dyn StepBook<'a>, after: &AfterSteps) -> Result<Trained> {
        let mut failure = None;
        while let Some(micro) = book.next_step() {
            match self.step(&micro) {
                Ok(step) => book.step_done(step)?,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let per_rank_peak = match (after.gather_peaks, &failure) {
            (Some(gather), None) => Some(gather(self.finish().map(|m| m.peak_bytes).unwrap_or(0))?),
            _ => None,
        };
        let mut eval = None;
        if let (Some((blocks, batch_size)), None) = (after.eval, &failure) {
            match self.eval(blocks, batch_size) {
                Ok(r) => eval = Some(r),
                Err(e) => failure = Some(e),
            }
        }
        if let (Some(dir), None) = (after.save, &failure) {
            self.save(dir)?;
            saved_note(dir);
        }
        let memory = match failure.is_some() && !after.memory_after_failure {
            true => MemoryReading::default(),
            false => memory_or_warning(self.finish()),
        };
        Ok(Trained {
            failure,
            per_rank_peak,
            eval,
            memory,
        })
    }
}
