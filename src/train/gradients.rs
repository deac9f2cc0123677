//! A step's gradients: the graph they come from (`Graph`: the model's ops under autograd, or
//! GPT-2's manual step, ZeRO-3's gathering block by block), one micro-batch through either,
//! their sum over the micro-batches (or their hand-off to ZeRO-2/3's shards); and the loss
//! ([`lm_loss`], [`Trainer::eval_loss`]).

use super::clock::PhaseClock;
use super::data_parallel::DataParallel;
use super::gpt2_manual::params::{Block, Gpt2Params, Group};
use super::gpt2_manual::Gpt2Step;
use super::trainer::{Backward, Trainer};
use super::zero::{GradShards, Sharded};
use crate::models::{Architecture, CausalLm};
use candle_core::{DType, Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

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

/// What computes a step's gradients: the model's ops under autograd, or GPT-2's manual step.
pub(super) enum Graph {
    Autograd(Box<dyn CausalLm>),
    Manual(Gpt2Step),
}

impl Trainer {
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
    pub(super) fn graph(&self) -> crate::error::Result<Graph> {
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
        // The copies the last update wrote (CUDA), else in a few launches where the masters
        // are f32 on CUDA (148 casts for gpt2).
        let written = self.opt.copies().filter(|c| {
            let like =
                |(t, m): (&Tensor, &Tensor)| t.dims() == m.dims() && t.dtype() == self.compute;
            c.len() == masters.len() && c.iter().zip(&masters).all(like)
        });
        let copies = match (self.compute, written) {
            (DType::F32, _) => None,
            (_, Some(c)) => Some(c.to_vec()),
            (dtype, None) => crate::kernels::cast_multi(&masters, dtype)?,
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
    pub(super) fn accumulate(
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
    pub(super) fn autograd(
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
        let (loss, forward) = step.forward_train(ids, loss_scale)?;
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

    /// One micro-batch through GPT-2's manual step, its gradients handed to `shards` group by
    /// group as the backward makes them (nothing of them kept here); its loss.
    pub(super) fn manual_into(
        &self,
        step: &Gpt2Step,
        ids: &Tensor,
        loss_scale: f64,
        shards: &mut GradShards<'_>,
        clock: &mut PhaseClock<'_>,
    ) -> Result<Tensor> {
        let (loss, forward) = step.forward_train(ids, loss_scale)?;
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
