//! The [`Trainer`]: fp32 master parameters, optimizer state and schedule, and its setup: how
//! gradients are computed ([`Backward`], `--recompute`), data parallelism and ZeRO sharding,
//! the model over the masters. Its step is in [`super::step`], the gradients of a step in
//! [`super::gradients`].

use super::data_parallel::DataParallel;
use super::optim::{AdamW, GradScaler, LinearSchedule};
use super::params::{ParamBackend, Params};
use super::zero::{Sharded, ZeroStage};
use crate::models::{Architecture, CausalLm, ModelSpec, WeightSource};
use crate::record::{Hyper, Recompute};
use candle_core::{DType, Device, Result, Tensor, Var};
use std::sync::{Arc, Mutex};

/// How a step computes its gradients (`--backward`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backward {
    /// GPT-2's forward and backward written per block ([`super::gpt2_manual`]); GPT-2 only.
    Manual,
    /// candle's autograd through the model's ops (every model).
    Autograd,
}

impl Backward {
    /// The default for `spec`: manual for GPT-2 (the same gradients, 1.7x autograd's
    /// samples/s on an H100: docs/perf-notes.md), autograd for every other model.
    pub fn default_for(spec: &ModelSpec) -> Self {
        match spec.arch {
            Architecture::Gpt2(_) => Self::Manual,
            _ => Self::Autograd,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Manual => "manual",
            Self::Autograd => "autograd",
        }
    }

    /// Whether `spec` can train this way: the manual backward is written for GPT-2 only.
    pub fn check(self, spec: &ModelSpec) -> crate::error::Result<()> {
        if self == Self::Manual && !matches!(spec.arch, Architecture::Gpt2(_)) {
            return Err(crate::error::Error::Unsupported(format!(
                "--backward manual is written for GPT-2; {} ({}) trains with --backward autograd",
                spec.name,
                spec.architecture()
            )));
        }
        Ok(())
    }
}

/// Model spec + fp32 master parameters + optimizer state.
pub struct Trainer {
    pub(super) spec: ModelSpec,
    pub(super) params: Arc<Mutex<Params>>,
    pub(super) vars: Vec<Var>,
    pub(super) opt: AdamW,
    pub(super) schedule: LinearSchedule,
    pub(super) hyper: Hyper,
    pub(super) compute: DType,
    pub(super) device: Device,
    pub(super) dropout: bool,
    pub(super) backward: Backward,
    /// `--recompute`: what the manual step keeps of each block.
    pub(super) recompute: Recompute,
    pub(super) scaler: Option<GradScaler>,
    /// Optimizer steps taken (skipped fp16 steps not counted), the schedule's position.
    pub step: usize,
    /// Synchronize between forward, backward and update to time each (`--phase-times`).
    pub phase_times: bool,
    pub(super) data_parallel: Option<DataParallel>,
    /// ZeRO-1: the owner rank of each parameter (the optimizer holds only this rank's).
    pub(super) owners: Vec<usize>,
    /// ZeRO-2/3: this rank's shards (the optimizer holds their masters).
    pub(super) sharded: Option<Arc<Sharded>>,
}

impl Trainer {
    /// Loads the weights from `source` as fp32 masters; `compute`: the forward/backward dtype.
    pub fn new(
        spec: &ModelSpec,
        source: &WeightSource,
        compute: DType,
        device: &Device,
        hyper: Hyper,
        dropout: bool,
    ) -> crate::error::Result<Self> {
        let params = Arc::new(Mutex::new(Params::default()));
        let backend = ParamBackend {
            source: Some(source.backend(spec.prefixes(), None)?),
            params: params.clone(),
            detached: false,
        };
        drop(spec.load_backend(Box::new(backend), DType::F32, device)?);
        let vars = params.lock().expect("params lock").vars.clone();
        let opt = AdamW::new(vars.clone(), &hyper)?;
        Ok(Self {
            spec: spec.clone(),
            params,
            vars,
            opt,
            schedule: LinearSchedule {
                base: hyper.learning_rate,
                warmup: hyper.lr_warmup_steps,
                total: hyper.total_steps,
            },
            hyper,
            compute,
            device: device.clone(),
            dropout,
            backward: Backward::default_for(spec),
            recompute: Recompute::Off,
            scaler: (compute == DType::F16).then(GradScaler::default),
            step: 0,
            phase_times: false,
            data_parallel: None,
            owners: vec![],
            sharded: None,
        })
    }

    /// Picks how gradients are computed; `Manual` is for GPT-2 only.
    pub fn set_backward(&mut self, backward: Backward) -> crate::error::Result<()> {
        backward.check(&self.spec)?;
        self.backward = backward;
        Ok(())
    }

    /// How this trainer computes gradients.
    pub fn backward(&self) -> Backward {
        self.backward
    }

    /// `--recompute`: keep each block's input only ([`Recompute::Blocks`]) or its attention
    /// half ([`Recompute::Mlp`]) and run the rest of its forward again in the backward
    /// (activation checkpointing). The manual step's (GPT-2); call after
    /// [`Trainer::set_backward`].
    pub fn set_recompute(&mut self, recompute: Recompute) -> crate::error::Result<()> {
        if recompute != Recompute::Off && self.backward != Backward::Manual {
            return Err(crate::error::Error::Unsupported(format!(
                "--recompute checkpoints the blocks of the manual step (GPT-2, --backward manual); {} trains with --backward {}",
                self.spec.name,
                self.backward.as_str()
            )));
        }
        self.recompute = recompute;
        Ok(())
    }

    /// What the manual step keeps of each block (`--recompute`).
    pub fn recompute(&self) -> Recompute {
        self.recompute
    }

    /// Makes this trainer one rank of a data-parallel group. Every rank must start from the
    /// same weights (the same source and seed) and call [`Trainer::step`] as often.
    pub fn set_data_parallel(&mut self, dp: DataParallel) -> crate::error::Result<()> {
        if dp.zero.sharded() {
            self.shard(&dp)?;
        }
        if dp.zero == ZeroStage::Optimizer {
            let sizes: Vec<usize> = self.vars.iter().map(|v| v.elem_count()).collect();
            self.owners = DataParallel::owners(&sizes, dp.size);
            let mine: Vec<Var> = self
                .vars
                .iter()
                .zip(&self.owners)
                .filter(|(_, &o)| o == dp.rank)
                .map(|(v, _)| v.clone())
                .collect();
            self.opt = AdamW::new(mine, &self.hyper)?;
        }
        if dp.overlap && !dp.zero.sharded() {
            // A step's started sums: every gradient in f32 (each run aligned), and the loss.
            let runs = self
                .vars
                .iter()
                .map(|v| (4 * v.elem_count()).next_multiple_of(256));
            dp.reduce.prepare_started_sums(runs.sum::<usize>() + 4096)?;
        }
        self.data_parallel = Some(dp);
        Ok(())
    }

    /// ZeRO-2/3: this rank's shards of the masters, the optimizer over them; stage 3 then
    /// drops the whole masters (its steps gather each block's weights when they need them).
    fn shard(&mut self, dp: &DataParallel) -> crate::error::Result<()> {
        if dp.zero == ZeroStage::Parameters && self.backward != Backward::Manual {
            return Err(crate::error::Error::Unsupported(format!(
                "--zero 3 gathers each block's weights inside GPT-2's manual step; {} trains with --backward {}: use --zero 2 (or 1)",
                self.spec.name,
                self.backward.as_str()
            )));
        }
        let mut params = self.params.lock().expect("params lock");
        let masters: Vec<Tensor> = params.vars.iter().map(|v| v.as_detached_tensor()).collect();
        let z = Sharded::new(&params.names, &masters, dp.rank, dp.size, dp.reduce.clone())?;
        self.opt = AdamW::new(z.masters.clone(), &self.hyper)?;
        if dp.zero == ZeroStage::Parameters {
            params.vars.clear();
            self.vars.clear();
        }
        self.sharded = Some(Arc::new(z));
        Ok(())
    }

    /// The model over the current masters in the compute dtype; `train`: differentiable ops
    /// (and dropout when enabled), else inference kernels on detached weights.
    pub fn model(&self, train: bool) -> crate::error::Result<Box<dyn CausalLm>> {
        let backend = ParamBackend {
            source: None,
            params: self.params.clone(),
            detached: !train,
        };
        let mut model = self
            .spec
            .load_backend(Box::new(backend), self.compute, &self.device)?;
        if train {
            model.set_training(self.dropout);
        }
        Ok(model)
    }

    /// The masters in the compute dtype as the last update wrote them beside the f32 masters
    /// (CUDA, bf16 / f16, the manual step without ZeRO), the next step's weights; None where
    /// the next step casts them itself.
    pub fn written_copies(&self) -> Option<&[Tensor]> {
        self.opt.copies()
    }

    /// (name, fp32 master) of every parameter, in load order (ZeRO-3: gathered).
    pub fn named_params(&self) -> Result<Vec<(String, Tensor)>> {
        let p = self.params.lock().expect("params lock");
        let masters = match (&self.sharded, p.vars.is_empty()) {
            (Some(z), true) => z.gather_all(DType::F32)?,
            _ => p.vars.iter().map(|v| v.as_detached_tensor()).collect(),
        };
        Ok(p.names.iter().cloned().zip(masters).collect())
    }
}
