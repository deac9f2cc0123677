//! The training step: the model rebuilt from fp32 masters in the compute dtype, the loss,
//! the backward, gradient all-reduce over data-parallel ranks, and the optimizer update.

use super::comm_clock::{CommClock, CommSpan};
use super::gpt2_manual::params::{Block, Gpt2Params, Group};
use super::gpt2_manual::Gpt2Step;
use super::optim::{AdamW, Clip, GradScaler, LinearSchedule};
use super::zero::{Sharded, ZeroStage};
use crate::dist::AllReduce;
use crate::models::{Architecture, CausalLm, ModelSpec, WeightSource};
use crate::record::{Hyper, PhaseMs};
use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::Init;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Accumulates device-synchronized wall time into the phases of a step; does nothing (no
/// synchronize) without a device.
struct PhaseClock<'a> {
    device: Option<&'a Device>,
    last: std::time::Instant,
    phases: PhaseMs,
}

impl<'a> PhaseClock<'a> {
    fn new(device: Option<&'a Device>) -> Result<Self> {
        if let Some(d) = device {
            d.synchronize()?;
        }
        Ok(Self {
            device,
            last: std::time::Instant::now(),
            phases: PhaseMs {
                forward: 0.,
                backward: 0.,
                update: 0.,
            },
        })
    }

    /// Adds the time since the last lap to the phase `pick` selects.
    fn lap(&mut self, pick: impl Fn(&mut PhaseMs) -> &mut f64) -> Result<()> {
        if let Some(d) = self.device {
            d.synchronize()?;
            let now = std::time::Instant::now();
            *pick(&mut self.phases) += (now - self.last).as_secs_f64() * 1e3;
            self.last = now;
        }
        Ok(())
    }

    fn phases(&self) -> Option<PhaseMs> {
        self.device.map(|_| self.phases)
    }
}

/// The step's summed loss ((1,) f32) and its unscaled gradient norm, in one device read.
fn read_loss_and_norm(loss_sum: &Tensor, clip: &Clip) -> Result<(f64, f64)> {
    match clip {
        Clip::Device(t) => {
            let both = Tensor::cat(&[loss_sum, t], 0)?.to_vec1::<f32>()?; // (3,)
            Ok((both[0] as f64, both[1] as f64))
        }
        Clip::Host { norm, .. } => Ok((loss_sum.to_vec1::<f32>()?[0] as f64, *norm)),
    }
}

/// Mean next-token cross-entropy of `ids` (B, T) u32: position t predicts token t+1, over
/// B·(T−1) positions, in f32. A scalar f32 tensor.
pub fn lm_loss(model: &dyn CausalLm, ids: &Tensor) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let mask = Tensor::ones((b, t), DType::U32, ids.device())?;
    let hidden = model.hidden_states(ids, &mask)?; // (B, T, C)
    let hidden = hidden.narrow(1, 0, t - 1)?.contiguous()?; // (B, T-1, C)
    let c = hidden.dim(2)?;
    let hidden = hidden.reshape((b * (t - 1), c))?;
    let multiple = crate::models::loss::head_padding(ids.device());
    let (logits, vocab) = model.logits_padded(&hidden, multiple)?; // (B·(T-1), V' ≥ V)
    let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?; // (B·(T-1),)
    crate::models::loss::cross_entropy_rows(&logits, &targets, vocab)?.mean_all()
}

/// Parameter `name`'s tensor, taken out of `tensors` (by parameter index).
fn take(
    tensors: &mut HashMap<usize, Tensor>,
    index: &HashMap<String, usize>,
    name: &str,
) -> Result<Tensor> {
    match index.get(name).and_then(|i| tensors.remove(i)) {
        Some(t) => Ok(t),
        None => candle_core::bail!("parameter '{name}' not among the gathered ones"),
    }
}

/// Hands the model its parameters: on the first load it takes each tensor from the real source
/// (checkpoint or random init) in fp32 and makes it a [`Var`]; afterwards it serves those Vars
/// cast to the dtype asked for (a differentiable cast; a no-op for fp32).
struct ParamBackend {
    source: Option<Box<dyn SimpleBackend>>,
    params: Arc<Mutex<Params>>,
    detached: bool,
}

/// The trainable parameters by checkpoint name, in load order.
#[derive(Default)]
pub struct Params {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
    index: HashMap<String, usize>,
}

impl SimpleBackend for ParamBackend {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut params = self.params.lock().expect("params lock");
        let var = match (params.index.get(name), &self.source) {
            (Some(&i), _) => params.vars[i].clone(),
            (None, Some(source)) => {
                let var = Var::from_tensor(&source.get(s.clone(), name, h, DType::F32, dev)?)?;
                let i = params.vars.len();
                params.index.insert(name.to_string(), i);
                params.names.push(name.to_string());
                params.vars.push(var.clone());
                var
            }
            (None, None) => candle_core::bail!("no parameter '{name}'"),
        };
        if var.shape() != &s {
            candle_core::bail!("parameter '{name}' is {:?}, asked for {s:?}", var.shape());
        }
        let t = if self.detached {
            var.as_detached_tensor()
        } else {
            var.as_tensor().clone()
        };
        t.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        candle_core::bail!("training needs a shape for '{name}'")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        let known = self
            .params
            .lock()
            .expect("params lock")
            .index
            .contains_key(name);
        known
            || self
                .source
                .as_ref()
                .is_some_and(|s| s.contains_tensor(name))
    }
}

/// One optimizer step's outcome.
#[derive(Clone, Debug)]
pub struct StepOutcome {
    /// Mean of the micro-batch losses (unscaled), as HF logs `loss`.
    pub loss: f64,
    /// Global gradient norm before clipping (unscaled).
    pub grad_norm: f64,
    /// Learning rate the step used.
    pub lr: f64,
    /// fp16: the step was skipped for inf/NaN gradients (the scale halves, lr does not advance).
    pub skipped: bool,
    pub loss_scale: Option<f64>,
    /// Set when the trainer times phases.
    pub phases_ms: Option<PhaseMs>,
    /// Data parallelism: milliseconds in all-reduces (device synchronized around them).
    pub comm_ms: Option<f64>,
    /// Milliseconds the host took to queue the step, from its start to its one sync (None
    /// where phases or all-reduces sync inside it): near the step's latency, the GPU waited
    /// on the host.
    pub host_ms: Option<f64>,
}

/// Gradients summed in buckets of at most this many values: one collective per bucket, not per
/// tensor (torch DDP's default bucket is 25 MiB; ours holds 32 Mi fp32 values, 128 MiB).
const BUCKET: usize = 1 << 25;

/// `tensors` as flat f32 tensors, ready to be concatenated into one bucket.
fn flat_f32(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let flat = tensors
        .iter()
        .map(|t| t.to_dtype(DType::F32)?.flatten_all());
    flat.collect()
}

/// Each of `tensors`' shape over its run of `sum`, the bucket they were concatenated into.
fn views(sum: &Tensor, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    let mut offset = 0;
    let views = tensors.iter().map(|t| {
        let k = t.elem_count();
        offset += k;
        sum.narrow(0, offset - k, k)?.reshape(t.shape())
    });
    views.collect()
}

/// This rank of a data-parallel group.
pub struct DataParallel {
    pub rank: usize,
    pub size: usize,
    pub reduce: Arc<dyn AllReduce>,
    /// What the ranks split (`--zero`).
    pub zero: ZeroStage,
    /// Start each block's all-reduce in the manual backward (`--dp-overlap`).
    pub overlap: bool,
}

impl DataParallel {
    /// Starts summing `tensors` over the ranks as one bucket, in f32 (one buffer, one
    /// collective): what it returns holds the sums once [`DataParallel::wait`] is called.
    fn start(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let flat = flat_f32(&tensors)?;
        // A buffer of its own (cat returns a lone tensor as it is): NCCL sums over it in place.
        let buffer = match flat.len() {
            1 => flat[0].copy()?,
            _ => Tensor::cat(&flat, 0)?,
        };
        views(&self.reduce.start_sum(buffer)?, &tensors)
    }

    /// Orders the device's work queued next after every started sum.
    fn wait(&self) -> Result<()> {
        self.reduce.wait_sums()
    }

    /// Sums `tensors` (f32) over the ranks, in buckets, on the device's stream (NCCL on a
    /// stream of its own, as [`DataParallel::start`] runs it, measured 5–7 % slower at dp 2
    /// on 2× H200 when it does not overlap anything: results/h200/overlap-run3).
    fn all_reduce(&self, tensors: &mut [Tensor]) -> Result<()> {
        let mut start = 0;
        while start < tensors.len() {
            let mut end = start;
            let mut n = 0;
            while end < tensors.len() && (end == start || n + tensors[end].elem_count() <= BUCKET) {
                n += tensors[end].elem_count();
                end += 1;
            }
            let bucket = &mut tensors[start..end];
            let sum = self
                .reduce
                .all_reduce_sum(&Tensor::cat(&flat_f32(bucket)?, 0)?)?;
            let sums = views(&sum, bucket)?;
            bucket.clone_from_slice(&sums);
            start = end;
        }
        Ok(())
    }

    /// ZeRO-1 owner of each of `sizes` (parameter element counts): contiguous runs of
    /// parameters, about equal in elements.
    pub fn owners(sizes: &[usize], ranks: usize) -> Vec<usize> {
        let total: usize = sizes.iter().sum();
        let mut before = 0;
        sizes
            .iter()
            .map(|&n| {
                // The rank whose equal share holds this parameter's middle element.
                let mid = before + n / 2;
                before += n;
                (mid * ranks / total.max(1)).min(ranks - 1)
            })
            .collect()
    }
}

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

/// What computes a step's gradients: the model's ops under autograd, or GPT-2's manual step.
enum Graph {
    Autograd(Box<dyn CausalLm>),
    Manual(Gpt2Step),
}

/// Model spec + fp32 master parameters + optimizer state.
pub struct Trainer {
    spec: ModelSpec,
    params: Arc<Mutex<Params>>,
    vars: Vec<Var>,
    opt: AdamW,
    schedule: LinearSchedule,
    hyper: Hyper,
    compute: DType,
    device: Device,
    dropout: bool,
    backward: Backward,
    /// `--recompute`: the manual step checkpoints each block.
    recompute: bool,
    scaler: Option<GradScaler>,
    /// Optimizer steps taken (skipped fp16 steps not counted), the schedule's position.
    pub step: usize,
    /// Synchronize between forward, backward and update to time each (`--phase-times`).
    pub phase_times: bool,
    data_parallel: Option<DataParallel>,
    /// ZeRO-1: the owner rank of each parameter (the optimizer holds only this rank's).
    owners: Vec<usize>,
    /// ZeRO-2/3: this rank's shards (the optimizer holds their masters).
    sharded: Option<Arc<Sharded>>,
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
            recompute: false,
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

    /// `--recompute`: keep each block's input only and run the block's forward again in the
    /// backward (activation checkpointing). The manual step's (GPT-2); call after
    /// [`Trainer::set_backward`].
    pub fn set_recompute(&mut self, recompute: bool) -> crate::error::Result<()> {
        if recompute && self.backward != Backward::Manual {
            return Err(crate::error::Error::Unsupported(format!(
                "--recompute checkpoints the blocks of the manual step (GPT-2, --backward manual); {} trains with --backward {}",
                self.spec.name,
                self.backward.as_str()
            )));
        }
        self.recompute = recompute;
        Ok(())
    }

    /// Whether blocks are checkpointed (`--recompute`).
    pub fn recompute(&self) -> bool {
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

    /// (name, fp32 master) of every parameter, in load order (ZeRO-3: gathered).
    pub fn named_params(&self) -> Result<Vec<(String, Tensor)>> {
        let p = self.params.lock().expect("params lock");
        let masters = match (&self.sharded, p.vars.is_empty()) {
            (Some(z), true) => z.gather_all(DType::F32)?,
            _ => p.vars.iter().map(|v| v.as_detached_tensor()).collect(),
        };
        Ok(p.names.iter().cloned().zip(masters).collect())
    }

    /// The optimizer update with `grads`; with ZeRO-1 only this rank's parameters, then every
    /// parameter from its owner. Returns the milliseconds that sharing took (ZeRO-1 only).
    fn update(&mut self, grads: &[Tensor], lr: f64, clip: &Clip) -> Result<Option<CommSpan>> {
        let dp = match &self.data_parallel {
            Some(dp) if dp.zero == ZeroStage::Optimizer => dp,
            _ => return self.opt.step_clipped(grads, lr, clip).map(|()| None),
        };
        let mine: Vec<Tensor> = grads
            .iter()
            .zip(&self.owners)
            .filter(|(_, &o)| o == dp.rank)
            .map(|(g, _)| g.clone())
            .collect();
        self.opt.step_clipped(&mine, lr, clip)?;
        // Every parameter from its owner: the others contribute zeros to the sum (an all-gather
        // through the one collective we have).
        let comm = CommClock::start(&self.device)?;
        let mut shared = self
            .vars
            .iter()
            .zip(&self.owners)
            .map(|(v, &o)| match o == dp.rank {
                true => Ok(v.as_detached_tensor()),
                false => v.zeros_like(),
            })
            .collect::<Result<Vec<_>>>()?;
        dp.all_reduce(&mut shared)?;
        for (v, p) in self.vars.iter().zip(shared) {
            v.set(&p)?;
        }
        comm.stop(&self.device).map(Some)
    }

    /// One optimizer step over `micro_batches` (each (B, T) u32 on the device; gradient
    /// accumulation when more than one).
    pub fn step(&mut self, micro_batches: &[Tensor]) -> crate::error::Result<StepOutcome> {
        if self.sharded.is_some() {
            return self.step_sharded(micro_batches);
        }
        let queued = std::time::Instant::now();
        let graph = self.graph()?;
        let n = micro_batches.len() as f64;
        let scale = self.scaler.as_ref().map_or(1., |s| s.scale);
        // A handle of its own: the clock spans the update, which borrows the trainer mutably.
        let device = self.device.clone();
        let mut clock = PhaseClock::new(self.phase_times.then_some(&device))?;
        // One micro-batch on one GPU: the gradients stay in the compute dtype, and the
        // multi-tensor update reads them as they are (no cast pass to f32 first).
        let native = micro_batches.len() == 1
            && self.data_parallel.is_none()
            && self.device.is_cuda()
            && crate::kernels::enabled(crate::kernels::Fused::Adamw);
        // Data parallel: the ranks' mean's 1/ranks rides in the backward's seed (exact for a
        // power of two), so the all-reduce's sum is the mean without a pass of its own.
        let ranks = self.data_parallel.as_ref().map_or(1., |dp| dp.size as f64);
        // One micro-batch through the manual backward: each block's gradients start their
        // all-reduce as soon as they are final, under the rest of the backward (#21 item 5).
        let overlap = micro_batches.len() == 1 && matches!(graph, Graph::Manual(_));
        let overlap = match &self.data_parallel {
            Some(dp) if overlap && dp.overlap => Some(dp),
            _ => None,
        };
        let (mut grads, mut loss_sum) = self.accumulate(
            &graph,
            micro_batches,
            scale / (n * ranks),
            native,
            overlap,
            &mut clock,
        )?;
        let overlap = overlap.is_some();
        drop(graph);
        let mut comm = Vec::new();
        if let Some(dp) = &self.data_parallel {
            // The sum over ranks of each rank's mean / ranks: the mean; the loss rides along.
            // With the sums started in the backward, what is timed is the wait left after it.
            let clock = CommClock::start(&self.device)?;
            match overlap {
                true => loss_sum = dp.start(vec![loss_sum])?.remove(0),
                false => {
                    grads.push(loss_sum);
                    dp.all_reduce(&mut grads)?;
                    loss_sum = grads.pop().expect("the loss");
                }
            }
            dp.wait()?;
            comm.push(clock.stop(&self.device)?);
        }
        // Unscaling (fp16) and clipping ride in the optimizer's kernel as one factor, which
        // stays on the device on CUDA: the host reads the norm only for fp16's skip decision.
        let clip = Clip::of(&grads, scale, self.hyper.max_grad_norm)?;
        let lr = self.schedule.lr(self.step);
        let apply = match self.scaler.as_mut() {
            Some(s) => s.update(clip.read()?.0.is_finite()),
            None => true,
        };
        if apply {
            comm.extend(self.update(&grads, lr, &clip)?);
            self.step += 1;
        }
        clock.lap(|p| &mut p.update)?;
        let mut out = self.outcome(queued, &loss_sum, &clip, n * ranks, &clock)?;
        out.comm_ms = match comm.is_empty() {
            true => None,
            false => Some(comm.iter().map(CommSpan::ms).sum::<Result<f64>>()?),
        };
        (out.lr, out.skipped) = (lr, !apply);
        Ok(out)
    }

    /// A step's outcome once its update is queued: the loss (the sum over `parts` micro-batch
    /// means) and the norm read in the step's one sync; the caller sets lr, skipped, comm.
    fn outcome(
        &self,
        queued: std::time::Instant,
        loss_sum: &Tensor,
        clip: &Clip,
        parts: f64,
        clock: &PhaseClock<'_>,
    ) -> Result<StepOutcome> {
        let syncs_inside = self.phase_times || self.scaler.is_some();
        let host_ms = (!syncs_inside).then(|| queued.elapsed().as_secs_f64() * 1e3);
        let (loss_sum, grad_norm) = read_loss_and_norm(loss_sum, clip)?;
        Ok(StepOutcome {
            comm_ms: None,
            host_ms,
            loss: loss_sum / parts,
            grad_norm,
            lr: f64::NAN,
            skipped: false,
            loss_scale: self.scaler.as_ref().map(|s| s.scale),
            phases_ms: clock.phases(),
        })
    }

    /// [`Trainer::step`] under ZeRO-2/3: each micro-batch's gradients reduce-scattered unit by
    /// unit as the backward makes them (the manual step) or after it (autograd), the norm
    /// from the shards, the update on this rank's shards; stage 2 then all-gathers them into
    /// the whole masters. Collectives run inside the backward, so no comm share is timed.
    fn step_sharded(&mut self, micro_batches: &[Tensor]) -> crate::error::Result<StepOutcome> {
        let queued = std::time::Instant::now();
        let (Some(dp), Some(z)) = (&self.data_parallel, &self.sharded) else {
            unreachable!("step_sharded runs with ZeRO-2/3 only")
        };
        let graph = self.graph()?;
        let (n, ranks) = (micro_batches.len() as f64, dp.size as f64);
        let scale = self.scaler.as_ref().map_or(1., |s| s.scale);
        let device = self.device.clone();
        let mut clock = PhaseClock::new(self.phase_times.then_some(&device))?;
        let mut shards = z.grads();
        let mut loss_sum = Tensor::zeros(1, DType::F32, &self.device)?;
        for ids in micro_batches {
            let loss = match &graph {
                Graph::Manual(step) => {
                    self.manual_into(step, ids, scale / (n * ranks), &mut shards, &mut clock)?
                }
                Graph::Autograd(model) => {
                    let (loss, grads) =
                        self.autograd(model.as_ref(), ids, scale / (n * ranks), &mut clock)?;
                    for (i, g) in grads {
                        shards.add(i, g)?;
                    }
                    loss
                }
            };
            loss_sum = (loss_sum + loss.to_dtype(DType::F32)?.reshape(1)?)?;
        }
        drop(graph);
        let grads = shards.finish()?;
        let loss_sum = dp.reduce.all_reduce_sum(&loss_sum)?;
        let clip = z.clip(&grads, scale, self.hyper.max_grad_norm)?;
        let lr = self.schedule.lr(self.step);
        let apply = match self.scaler.as_mut() {
            Some(s) => s.update(clip.read()?.0.is_finite()),
            None => true,
        };
        if apply {
            self.opt.step_clipped(&grads, lr, &clip)?;
            if dp.zero == ZeroStage::Gradients {
                // A unit at a time: one unit's whole f32 values beside the masters, not all.
                for u in 0..z.n_units() {
                    for (i, t) in z.gather(u, DType::F32)? {
                        self.vars[i].set(&t)?;
                    }
                }
            }
            self.step += 1;
        }
        clock.lap(|p| &mut p.update)?;
        let mut out = self.outcome(queued, &loss_sum, &clip, n * ranks, &clock)?;
        (out.lr, out.skipped) = (lr, !apply);
        Ok(out)
    }

    /// One micro-batch through GPT-2's manual step, its gradients handed to `shards` group by
    /// group as the backward makes them (nothing of them kept here); its loss.
    fn manual_into(
        &self,
        step: &Gpt2Step,
        ids: &Tensor,
        loss_scale: f64,
        shards: &mut super::zero::GradShards<'_>,
        clock: &mut PhaseClock<'_>,
    ) -> Result<Tensor> {
        let (loss, forward) = step.forward(ids)?;
        clock.lap(|p| &mut p.forward)?;
        let tied = self.tied();
        let index = self.params.lock().expect("params lock").index.clone();
        step.backward_with(forward, loss_scale, &mut |group: Group, grads| {
            let n = grads.len();
            for (name, g) in group.names(tied).iter().zip(grads) {
                match index.get(name) {
                    Some(&i) => shards.add(i, g)?,
                    None => candle_core::bail!("no parameter '{name}'"),
                }
            }
            // Empty stand-ins: the gradients live on only as this rank's shards.
            (0..n)
                .map(|_| Tensor::zeros(0, DType::F32, ids.device()))
                .collect()
        })?;
        clock.lap(|p| &mut p.backward)?;
        Ok(loss)
    }

    /// Whether GPT-2's head is `wte` (one gradient for both).
    fn tied(&self) -> bool {
        match &self.spec.arch {
            Architecture::Gpt2(cfg) => cfg.tie_word_embeddings,
            _ => true,
        }
    }

    /// The mean loss over `micro_batches` and every parameter's gradient of it (fp32, with its
    /// name, in load order): what a step would clip and apply, without taking the step.
    pub fn gradients(
        &self,
        micro_batches: &[Tensor],
    ) -> crate::error::Result<(f64, Vec<(String, Tensor)>)> {
        let graph = self.graph()?;
        let n = micro_batches.len() as f64;
        let (grads, loss_sum) = self.accumulate(
            &graph,
            micro_batches,
            1. / n,
            false,
            None,
            &mut PhaseClock::new(None)?,
        )?;
        let names = self.params.lock().expect("params lock").names.clone();
        let loss_sum = loss_sum.to_vec1::<f32>()?[0] as f64;
        Ok((loss_sum / n, names.into_iter().zip(grads).collect()))
    }

    /// The step's weights in the compute dtype: the model for autograd, or GPT-2's manual step.
    fn graph(&self) -> crate::error::Result<Graph> {
        match self.backward {
            Backward::Manual => Ok(Graph::Manual(self.manual_step(self.dropout)?)),
            Backward::Autograd => Ok(Graph::Autograd(self.model(true)?)),
        }
    }

    /// GPT-2's manual step over the masters' compute copies (ZeRO-3: the weights outside the
    /// blocks gathered now, each block's when the step reaches it).
    fn manual_step(&self, dropout: bool) -> crate::error::Result<Gpt2Step> {
        let Architecture::Gpt2(cfg) = &self.spec.arch else {
            return Err(crate::error::Error::Unsupported(
                "the manual step is GPT-2's".into(),
            ));
        };
        let params = self.params.lock().expect("params lock");
        if let (Some(z), true) = (&self.sharded, params.vars.is_empty()) {
            return Ok(self.gathered_step(cfg, z.clone(), &params.index, dropout)?);
        }
        let masters: Vec<Tensor> = params.vars.iter().map(|v| v.as_detached_tensor()).collect();
        // In a few launches where the masters are f32 on CUDA (148 casts for gpt2).
        let copies = match self.compute {
            DType::F32 => None,
            dtype => crate::kernels::cast_multi(&masters, dtype)?,
        };
        let weights = Gpt2Params::load(cfg, |name| match params.index.get(name) {
            Some(&i) => match &copies {
                Some(c) => Ok(c[i].clone()),
                None => masters[i].to_dtype(self.compute),
            },
            None => candle_core::bail!("no parameter '{name}'"),
        })?;
        Ok(Gpt2Step::new(cfg, weights, dropout, self.recompute)?)
    }

    /// ZeRO-3's step: the weights outside the blocks gathered for the whole step, each block's
    /// gathered when the forward or the backward reaches it and dropped after.
    fn gathered_step(
        &self,
        cfg: &crate::models::gpt2::Config,
        z: Arc<Sharded>,
        index: &HashMap<String, usize>,
        dropout: bool,
    ) -> Result<Gpt2Step> {
        let dtype = self.compute;
        let mut root: HashMap<usize, Tensor> = HashMap::new();
        for u in z.root_units() {
            root.extend(z.gather(u, dtype)?);
        }
        let root_cfg = crate::models::gpt2::Config {
            n_layer: 0,
            ..cfg.clone()
        };
        let root = Gpt2Params::load(&root_cfg, |name| take(&mut root, index, name))?;
        let (index, tied) = (index.clone(), cfg.tie_word_embeddings);
        let gather = move |i: usize| -> Result<Block> {
            let Some(u) = z.block_unit(i) else {
                candle_core::bail!("block {i} has no parameters")
            };
            let mut tensors: HashMap<usize, Tensor> = z.gather(u, dtype)?.into_iter().collect();
            let names = Group::Block(i).names(tied);
            let weights = names.iter().map(|n| take(&mut tensors, &index, n));
            Block::from_vec(weights.collect::<Result<Vec<_>>>()?)
        };
        Gpt2Step::gathered(cfg, root, Box::new(gather), dropout, self.recompute)
    }

    /// Σ over `micro_batches` of the gradients of loss · `loss_scale`, fp32 (`native`: in the
    /// dtype the backward made them), one per parameter in `self.vars` order (zeros where a
    /// parameter got none), and the sum of the losses ((1,) f32 on the device: nothing is read
    /// back here).
    fn accumulate(
        &self,
        graph: &Graph,
        micro_batches: &[Tensor],
        loss_scale: f64,
        native: bool,
        overlap: Option<&DataParallel>,
        clock: &mut PhaseClock<'_>,
    ) -> Result<(Vec<Tensor>, Tensor)> {
        let mut acc: Vec<Option<Tensor>> = vec![None; self.vars.len()];
        let mut loss_sum = Tensor::zeros(1, DType::F32, &self.device)?;
        for ids in micro_batches {
            let (loss, grads) = match graph {
                Graph::Autograd(model) => self.autograd(model.as_ref(), ids, loss_scale, clock)?,
                Graph::Manual(step) => self.manual(step, ids, loss_scale, overlap, clock)?,
            };
            for (i, g) in grads {
                let g = if native { g } else { g.to_dtype(DType::F32)? };
                acc[i] = Some(match acc[i].take() {
                    Some(a) => (a + g)?,
                    None => g,
                });
            }
            loss_sum = (loss_sum + loss.to_dtype(DType::F32)?.reshape(1)?)?;
        }
        let grads = acc
            .into_iter()
            .zip(&self.vars)
            .map(|(g, v)| g.map_or_else(|| v.zeros_like(), Ok))
            .collect::<Result<Vec<_>>>()?;
        Ok((grads, loss_sum))
    }

    /// One micro-batch through autograd: its loss and (parameter index, gradient) pairs.
    fn autograd(
        &self,
        model: &dyn CausalLm,
        ids: &Tensor,
        loss_scale: f64,
        clock: &mut PhaseClock<'_>,
    ) -> Result<(Tensor, Vec<(usize, Tensor)>)> {
        let loss = lm_loss(model, ids)?;
        clock.lap(|p| &mut p.forward)?;
        let store = (&loss * loss_scale)?.backward()?;
        clock.lap(|p| &mut p.backward)?;
        // Detached: a Var's gradient (e.g. xᵀ·grad of a matmul) can still hold the step's whole
        // forward graph, which AdamW's moments would then keep alive step after step (fp32 and
        // tf32 ran out of memory after a few steps).
        let grads = self
            .vars
            .iter()
            .enumerate()
            .filter_map(|(i, var)| store.get(var.as_tensor()).map(|g| (i, g.detach())));
        Ok((loss, grads.collect()))
    }

    /// One micro-batch through GPT-2's manual step: its loss and (parameter index, gradient)
    /// pairs; with `overlap`, the gradients' all-reduce started (see [`DataParallel::start`]).
    fn manual(
        &self,
        step: &Gpt2Step,
        ids: &Tensor,
        loss_scale: f64,
        overlap: Option<&DataParallel>,
        clock: &mut PhaseClock<'_>,
    ) -> Result<(Tensor, Vec<(usize, Tensor)>)> {
        let (loss, forward) = step.forward(ids)?;
        clock.lap(|p| &mut p.forward)?;
        let grads = match overlap {
            Some(dp) => step.backward_with(forward, loss_scale, &mut |_, g| dp.start(g))?,
            None => step.backward(forward, loss_scale)?,
        };
        clock.lap(|p| &mut p.backward)?;
        let params = self.params.lock().expect("params lock");
        let index = |(name, g): (String, Tensor)| match params.index.get(&name) {
            Some(&i) => Ok((i, g)),
            None => candle_core::bail!("no parameter '{name}'"),
        };
        let grads = grads.into_named().into_iter().map(index);
        Ok((loss, grads.collect::<Result<Vec<_>>>()?))
    }

    /// Mean loss per block over `batches` (inference mode, no dropout): HF's `eval_loss` for
    /// equal-length blocks.
    pub fn eval_loss(&self, batches: &[Tensor]) -> crate::error::Result<f64> {
        // ZeRO-3 has no whole weights: its manual step gathers them block by block.
        let gathered = self.sharded.is_some() && self.vars.is_empty();
        let step = match gathered {
            true => Some(self.manual_step(false)?),
            false => None,
        };
        let model = match gathered {
            true => None,
            false => Some(self.model(false)?),
        };
        let (mut sum, mut count) = (0., 0usize);
        for ids in batches {
            let b = ids.dim(0)?;
            let loss = match (&step, &model) {
                (Some(step), _) => step.forward(ids)?.0,
                (_, Some(model)) => lm_loss(model.as_ref(), ids)?,
                _ => unreachable!("one of the two"),
            };
            let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            sum += loss * b as f64;
            count += b;
        }
        Ok(sum / count.max(1) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::optim::Moments;

    /// fp32 weights are the Vars themselves, so their raw gradients carry the forward graph;
    /// if the optimizer state kept it, every step's activations would stay alive.
    #[test]
    fn optimizer_state_holds_no_graph_after_fp32_steps() -> crate::error::Result<()> {
        let spec = ModelSpec::preset("gpt2-tiny")?;
        let hyper = Hyper {
            total_steps: 2,
            ..Hyper::default()
        };
        let dev = Device::Cpu;
        let random = WeightSource::Random { seed: 0 };
        let mut trainer = Trainer::new(&spec, &random, DType::F32, &dev, hyper, false)?;
        trainer.set_backward(Backward::Autograd)?;
        let ids = Tensor::arange(0u32, 32, &dev)?.reshape((2, 16))?;
        for _ in 0..2 {
            trainer.step(std::slice::from_ref(&ids))?;
        }
        let tracked = trainer.opt.moments.iter().flat_map(|m| match m {
            Moments::Split { m, v } => vec![m, v],
            Moments::Packed(mv) => vec![mv],
        });
        assert_eq!(tracked.filter(|t| t.track_op()).count(), 0);
        Ok(())
    }

    /// Sums in place as NCCL's started sums do: a group of two identical ranks, so the sum is
    /// the tensor doubled, written over the buffer it is given.
    struct DoubleInPlace;

    impl candle_core::InplaceOp1 for DoubleInPlace {
        fn name(&self) -> &'static str {
            "double-in-place"
        }

        fn cpu_fwd(&self, s: &mut candle_core::CpuStorage, _: &candle_core::Layout) -> Result<()> {
            match s {
                candle_core::CpuStorage::F32(v) => v.iter_mut().for_each(|x| *x *= 2.),
                _ => candle_core::bail!("f32 only"),
            }
            Ok(())
        }
    }

    impl AllReduce for DoubleInPlace {
        fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
            x * 2.
        }

        fn start_sum(&self, x: Tensor) -> Result<Tensor> {
            x.inplace_op1(&DoubleInPlace)?;
            Ok(x)
        }

        fn describe(&self) -> String {
            "double".into()
        }
    }

    /// An in-place sum never writes over the tensors it was given (a bucket of one tensor
    /// included, which `Tensor::cat` would hand back as it is), so ZeRO-1 can set each
    /// parameter from the sum of its own value.
    #[test]
    fn started_sums_leave_their_inputs_alone() -> Result<()> {
        let dp = DataParallel {
            rank: 0,
            size: 2,
            reduce: Arc::new(DoubleInPlace),
            zero: ZeroStage::Optimizer,
            overlap: false,
        };
        let big = Var::from_tensor(&Tensor::ones(BUCKET + 1, DType::F32, &Device::Cpu)?)?;
        let small = Tensor::arange(0f32, 6., &Device::Cpu)?.reshape((2, 3))?;
        let mut shared = vec![big.as_detached_tensor(), small.clone()];
        dp.all_reduce(&mut shared)?;
        big.set(&shared[0])?;
        assert_eq!(big.max_all()?.to_scalar::<f32>()?, 2.);
        assert_eq!(shared[1].to_vec2::<f32>()?, [[0., 2., 4.], [6., 8., 10.]]);
        assert_eq!(small.to_vec2::<f32>()?, [[0., 1., 2.], [3., 4., 5.]]);
        let bf16 = vec![
            small.to_dtype(DType::BF16)?,
            Tensor::ones(3, DType::F32, &Device::Cpu)?,
        ];
        let sums = dp.start(bf16)?;
        let lone = dp.start(vec![big.as_detached_tensor()])?;
        dp.wait()?;
        assert_eq!(lone[0].max_all()?.to_scalar::<f32>()?, 4.);
        let kept = big.max_all()?.to_scalar::<f32>()?;
        assert_eq!(kept, 2., "a lone bucket leaves its parameter alone");
        assert_eq!(sums[0].dtype(), DType::F32);
        assert_eq!(sums[1].to_vec1::<f32>()?, [2., 2., 2.]);
        Ok(())
    }
}
