//! One optimizer step ([`Trainer::step`]): the gradients of its micro-batches, their sum over
//! data-parallel ranks, clipping, the fp16 skip decision and the AdamW update (ZeRO-1: this
//! rank's parameters, then each from its owner; ZeRO-2/3: on this rank's shards), and what it
//! reports ([`StepOutcome`]).

use super::clock::{CommClock, CommSpan, PhaseClock};
use super::gradients::Graph;
use super::optim::Clip;
use super::trainer::Trainer;
use super::zero::ZeroStage;
use crate::record::PhaseMs;
use candle_core::{DType, Result, Tensor};

/// What one optimizer step computed, as a trainer reports it. An engine adds the latency it
/// measured around the step (`engines::TimedStep`); the scenario adds the step's number, epoch,
/// sample and token counts and writes it as the log's `record::StepRecord` (the JSONL schema).
/// The HF and llm.c engines fill it from their own step reports.
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

impl Trainer {
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
        // One micro-batch on CUDA: the gradients stay in the compute dtype, and the
        // multi-tensor update reads them as they are (no cast pass to f32 first); data
        // parallelism's buckets cast them to f32 as they copy them (one pass, not two).
        let native = micro_batches.len() == 1
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
            let (sum, span) = dp.sum_step(&mut grads, loss_sum, overlap, &self.device)?;
            loss_sum = sum;
            comm.push(span);
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
            self.opt.step_clipped(&grads, lr, &clip, None)?;
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

    /// The dtype the update writes the masters' copies in for the next step: the manual
    /// step's compute dtype, where it is not the masters' f32 (None: no copies). Only where
    /// the optimizer holds every master and nothing else sets them (no ZeRO).
    fn copy_dtype(&self) -> Option<DType> {
        let manual = self.backward == super::trainer::Backward::Manual;
        (manual && self.compute != DType::F32).then_some(self.compute)
    }

    /// The optimizer update with `grads`; with ZeRO-1 only this rank's parameters, then every
    /// parameter from its owner. Returns the milliseconds that sharing took (ZeRO-1 only).
    fn update(&mut self, grads: &[Tensor], lr: f64, clip: &Clip) -> Result<Option<CommSpan>> {
        let dp = match &self.data_parallel {
            Some(dp) if dp.zero == ZeroStage::Optimizer => dp,
            _ => {
                let copies = self.copy_dtype();
                return self
                    .opt
                    .step_clipped(grads, lr, clip, copies)
                    .map(|()| None);
            }
        };
        let mine: Vec<Tensor> = grads
            .iter()
            .zip(&self.owners)
            .filter(|(_, &o)| o == dp.rank)
            .map(|(g, _)| g.clone())
            .collect();
        self.opt.step_clipped(&mine, lr, clip, None)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{ModelSpec, WeightSource};
    use crate::record::Hyper;
    use crate::train::optim::Moments;
    use crate::train::trainer::Backward;
    use candle_core::Device;

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
}
