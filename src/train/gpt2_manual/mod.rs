//! GPT-2's training step without candle's autograd (`--backward manual`, issue #21): the
//! forward written out, keeping the activations its backward reads, and the backward per block
//! in reverse order, as llm.c does. Each parameter's gradient is produced once (autograd adds
//! every contribution into a zeros tensor it makes first); the residual stream's gradient is
//! carried from block to block, each branch's added to it once. candle tensors are the
//! storage, matmuls candle's (cuBLAS on CUDA); the rest runs the fused kernels where they apply
//! (`--fused`) and candle's ops otherwise (the CPU, where CI checks the same maths).
//!
//! The loss is `train::lm_loss`'s: mean next-token cross-entropy over B·(T−1) positions, the lm
//! head tied to `wte` (its two gradient contributions summed into one tensor), padded as the
//! loss pads it ([`head_padding`]). Dropout draws its masks in the autograd path's order
//! (embeddings; per block: attention probabilities, attention residual, MLP residual), so the
//! hashed masks (CUDA, `--fused dropout`) are the autograd path's for the same seed.
//!
//! Shapes: `B` batch, `T` time, `N` = B·T rows, `M` = B·(T−1) predicted positions, `C`
//! channels, `V` vocab (`V'` ≥ V with the padded head), `P` n_positions.

mod attention;
mod block;
mod ops;
pub mod params;

use crate::kernels::{self, Keep};
use crate::models::gpt2::Config;
use crate::models::layers::{Activation, Dropout};
use crate::models::loss::{cross_entropy_rows, cross_entropy_rows_grad, head_padding};
use crate::train::Recompute;
use attention::LazyBias;
use candle_core::{DType, Device, Result, Tensor};
use params::{Block, Gpt2Params, Group, Norm};
use std::borrow::Cow;

/// A block's weights made when the step reaches it (ZeRO-3: all-gathered from the shards),
/// dropped after use.
pub type GatherBlock = Box<dyn Fn(usize) -> Result<Block>>;

/// The weights of one optimizer step (compute-dtype copies of the masters) and its dropout.
pub struct Gpt2Step {
    cfg: Config,
    /// Every weight, or (with `gather`) every weight outside the blocks (`h` empty).
    w: Gpt2Params,
    gather: Option<GatherBlock>,
    /// The lm head (`wte` when tied) with zero rows to the loss's padding, (V', C).
    head: Tensor,
    act: Activation,
    dropout: Dropout,
    /// `--recompute`: what each block's forward keeps; the backward runs the rest again.
    recompute: Recompute,
}

/// What a block's forward leaves for its backward.
enum Kept {
    Acts(block::Acts),
    /// `--recompute blocks`: the input and the dropout masks.
    Checkpoint(block::Checkpoint),
    /// `--recompute mlp`: all but the MLP's inner activations.
    AttentionHalf(block::AttentionHalf),
}

/// A forward's activations, which its backward consumes.
pub struct Forward {
    ids: Tensor, // (B, T) u32
    drop_embd: Option<Keep>,
    ctx: block::Ctx,
    blocks: Vec<Kept>,
    x_last: Tensor,  // (N, C) ln_f's input
    hidden: Tensor,  // (M, C) ln_f's output at the predicting positions: the head's input
    logits: Tensor,  // (M, V'), or their gradient (see `logits_grad`)
    targets: Tensor, // (M,) u32
    /// Some(loss scale) where the forward wrote the loss's gradient for it over the logits.
    logits_grad: Option<f64>,
}

impl Gpt2Step {
    /// `weights`: every parameter in the compute dtype; `dropout`: the config's, else none;
    /// `recompute`: what each block keeps (the rest of its forward runs again in the backward).
    pub fn new(
        cfg: &Config,
        weights: Gpt2Params,
        dropout: bool,
        recompute: Recompute,
    ) -> Result<Self> {
        let act = Activation::parse(&cfg.activation_function).map_err(candle_core::Error::wrap)?;
        let dropout = match dropout {
            true => Dropout {
                embd: cfg.embd_pdrop,
                attn: cfg.attn_pdrop,
                resid: cfg.resid_pdrop,
            },
            false => Dropout::default(),
        };
        let head = padded_head(weights.lm_head.as_ref().unwrap_or(&weights.wte))?;
        Ok(Self {
            cfg: cfg.clone(),
            w: weights,
            gather: None,
            head,
            act,
            dropout,
            recompute,
        })
    }

    /// A step whose blocks' weights come from `gather` when the forward and the backward reach
    /// them (ZeRO-3); `root`: the weights outside the blocks (its `h` is not read).
    pub fn gathered(
        cfg: &Config,
        root: Gpt2Params,
        gather: GatherBlock,
        dropout: bool,
        recompute: Recompute,
    ) -> Result<Self> {
        let mut step = Self::new(cfg, root, dropout, recompute)?;
        step.w.h.clear();
        step.gather = Some(gather);
        Ok(step)
    }

    /// Block `i`'s weights: held, or gathered now.
    fn block(&self, i: usize) -> Result<Cow<'_, Block>> {
        match &self.gather {
            Some(gather) => Ok(Cow::Owned(gather(i)?)),
            None => Ok(Cow::Borrowed(&self.w.h[i])),
        }
    }

    /// The mean loss (scalar f32) of `ids` (B, T) u32, and what the backward needs.
    pub fn forward(&self, ids: &Tensor) -> Result<(Tensor, Forward)> {
        self.forward_with(ids, None)
    }

    /// [`Gpt2Step::forward`] for a backward at `loss_scale`: where the fused cross-entropy
    /// applies, the loss's gradient is written over the logits in the same pass (one read of
    /// them fewer), and only a backward at that scale can follow.
    pub fn forward_train(&self, ids: &Tensor, loss_scale: f64) -> Result<(Tensor, Forward)> {
        self.forward_with(ids, Some(loss_scale))
    }

    fn forward_with(&self, ids: &Tensor, loss_scale: Option<f64>) -> Result<(Tensor, Forward)> {
        let (b, t) = ids.dims2()?;
        if t < 2 || t > self.cfg.n_positions {
            candle_core::bail!("blocks of 2 to {} tokens, not {t}", self.cfg.n_positions);
        }
        let (c, eps) = (self.cfg.n_embd, self.cfg.layer_norm_epsilon);
        let ctx = self.ctx(b, t, ids.device())?;
        let x = match kernels::embedding_fwd(&self.w.wte, &self.w.wpe, ids)? {
            Some(x) => x, // (N, C)
            None => {
                let tok = self.w.wte.index_select(&ids.flatten_all()?, 0)?; // (N, C)
                let pos = self.w.wpe.narrow(0, 0, t)?; // (T, C)
                let x = tok.reshape((b, t, c))?.broadcast_add(&pos)?;
                x.reshape((b * t, c))?
            }
        };
        let (mut x, drop_embd) = ops::dropout(&x, self.dropout.embd)?;
        let mut blocks = Vec::with_capacity(self.cfg.n_layer);
        for i in 0..self.cfg.n_layer {
            let p = self.block(i)?;
            let (out, acts) = block::forward(&p, x, &ctx, self.cfg.attn_scale(i))?;
            blocks.push(match self.recompute {
                Recompute::Off => Kept::Acts(acts),
                Recompute::Blocks => Kept::Checkpoint(acts.checkpoint()),
                Recompute::Mlp => Kept::AttentionHalf(acts.attention_half()),
            });
            x = out;
        }
        let hf = ops::layer_norm(&x, &self.w.ln_f.weight, &self.w.ln_f.bias, eps)?; // (N, C)
        let hidden = hf.reshape((b, t, c))?.narrow(1, 0, t - 1)?.contiguous()?; // (B, T-1, C)
        let hidden = hidden.reshape((b * (t - 1), c))?; // (M, C)
        let logits = hidden.matmul(&self.head.t()?)?; // (M, V')
        let targets = ids.narrow(1, 1, t - 1)?.flatten_all()?; // (M,)
        let (v, m) = (self.cfg.vocab_size, b * (t - 1));
        // The logits are this function's own (the matmul's output).
        let fused = match loss_scale {
            Some(s) => kernels::cross_entropy_fused_in_place(&logits, &targets, row_grad(s, m), v)?,
            None => None,
        };
        let logits_grad = fused.as_ref().and(loss_scale);
        let loss = match fused {
            Some(rows) => rows,
            None => cross_entropy_rows(&logits, &targets, v)?,
        }
        .mean_all()?;
        let f = Forward {
            ids: ids.clone(),
            drop_embd,
            ctx,
            blocks,
            x_last: x,
            hidden,
            logits,
            targets,
            logits_grad,
        };
        Ok((loss, f))
    }

    /// Every parameter's gradient of `loss_scale` · the forward's loss: the projections' in
    /// the compute dtype, the LayerNorms' and embeddings' in f32.
    pub fn backward(&self, f: Forward, loss_scale: f64) -> Result<Gpt2Params> {
        self.backward_with(f, loss_scale, &mut |_, grads| Ok(grads))
    }

    /// [`Gpt2Step::backward`], handing each [`Group`] of gradients to `ready` as soon as it
    /// is final, which returns what stands for them: data parallelism starts their all-reduce
    /// there, under the rest of the backward; ZeRO-2/3 reduce-scatter them and keep nothing.
    pub fn backward_with(
        &self,
        f: Forward,
        loss_scale: f64,
        ready: &mut dyn FnMut(Group, Vec<Tensor>) -> Result<Vec<Tensor>>,
    ) -> Result<Gpt2Params> {
        let (b, t) = f.ids.dims2()?;
        let (c, m, v) = (self.cfg.n_embd, b * (t - 1), self.cfg.vocab_size);
        let dev = f.ids.device();
        let dlogits = match f.logits_grad {
            Some(s) if s == loss_scale => f.logits,
            Some(s) => candle_core::bail!(
                "the forward wrote the loss gradient at scale {s}, not {loss_scale}"
            ),
            None => self.logits_grad(f.logits, &f.targets, row_grad(loss_scale, m))?,
        }; // (M, V')
        let dhidden = dlogits.matmul(&self.head)?; // (M, C)
        let dhead = dlogits.t()?.matmul(&f.hidden)?.narrow(0, 0, v)?; // (V, C)
        drop(dlogits);
        // The last position predicts nothing: zero gradient there.
        let zeros = Tensor::zeros((b, 1, c), dhidden.dtype(), dev)?;
        let dhf = Tensor::cat(&[&dhidden.reshape((b, t - 1, c))?, &zeros], 1)?;
        let ln_f = &self.w.ln_f.weight;
        let eps = self.cfg.layer_norm_epsilon;
        let (mut dx, dw, db) =
            ops::layer_norm_bwd(&f.x_last, ln_f, &dhf.reshape((b * t, c))?, eps)?;
        let Ok([weight, bias]) = <[Tensor; 2]>::try_from(ready(Group::LnF, vec![dw, db])?) else {
            candle_core::bail!("ln_f has 2 gradients")
        };
        let ln_f = Norm { weight, bias };
        let mut h = Vec::with_capacity(f.blocks.len());
        for (i, kept) in f.blocks.into_iter().enumerate().rev() {
            let (scale, p) = (self.cfg.attn_scale(i), self.block(i)?);
            let acts = match kept {
                Kept::Acts(acts) => acts,
                Kept::Checkpoint(cp) => block::recompute(&p, cp, &f.ctx, scale)?,
                Kept::AttentionHalf(half) => block::recompute_mlp(&p, half, &f.ctx)?,
            };
            let (d, grads) = block::backward(&p, acts, dx, &f.ctx, scale)?;
            h.push(Block::from_vec(ready(Group::Block(i), grads.into_vec())?)?);
            dx = d;
        }
        h.reverse();
        let (wte, wpe, lm_head) = self.embedding_grads(&f.ids, &dx, &f.drop_embd, dhead)?;
        let embeddings = [wte, wpe].into_iter().chain(lm_head).collect();
        let mut embeddings = ready(Group::Embeddings, embeddings)?.into_iter();
        let (wte, wpe) = (embeddings.next(), embeddings.next());
        let (Some(wte), Some(wpe), lm_head) = (wte, wpe, embeddings.next()) else {
            candle_core::bail!("the embeddings' gradients")
        };
        Ok(Gpt2Params {
            wte,
            wpe,
            h,
            ln_f,
            lm_head,
        })
    }

    /// The gradient of the logits (M, V') at `g` a row. The logits are not read again: it is
    /// written over them where the kernel applies (the forward's `loss` holds no view of them).
    fn logits_grad(&self, logits: Tensor, targets: &Tensor, g: f32) -> Result<Tensor> {
        let (m, v) = (targets.elem_count(), self.cfg.vocab_size);
        let g = Tensor::full(g, m, logits.device())?;
        match kernels::cross_entropy_bwd_in_place(&logits, targets, &g, v)? {
            true => Ok(logits),
            false => cross_entropy_rows_grad(&logits, targets, &g, v),
        }
    }

    /// (wte, wpe, lm_head) gradients in f32 from dx (N, C), the gradient of the embeddings'
    /// sum (before dropout's backward), and the head's gradient `dhead` (V, C).
    fn embedding_grads(
        &self,
        ids: &Tensor,
        dx: &Tensor,
        drop_embd: &Option<Keep>,
        dhead: Tensor,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let (b, t) = ids.dims2()?;
        let c = self.cfg.n_embd;
        let demb = ops::to_f32(&ops::dropout_bwd(dx, drop_embd, self.dropout.embd)?)?;
        let dpos = demb.reshape((b, t, c))?.sum(0)?; // (T, C)
        let wpe = match self.cfg.n_positions - t {
            0 => dpos,
            unused => {
                let zeros = Tensor::zeros((unused, c), DType::F32, dx.device())?;
                Tensor::cat(&[&dpos, &zeros], 0)? // (P, C)
            }
        };
        // dst is this function's alone (the head gradient's own buffer or its f32 cast, or
        // zeros): the scatter adds into it.
        let ids = ids.flatten_all()?; // (N,)
        let scatter = |dst: Tensor| match kernels::embedding_bwd_in_place(&dst, &ids, &demb)? {
            true => Ok(dst),
            false => dst.index_add(&ids, &demb, 0),
        };
        Ok(match self.w.lm_head {
            // Tied: the head's gradient and the token embeddings' in one tensor.
            None => (scatter(ops::to_f32(&dhead)?)?, wpe, None),
            Some(_) => {
                let wte = Tensor::zeros(dhead.shape(), DType::F32, dx.device())?;
                (scatter(wte)?, wpe, Some(dhead))
            }
        })
    }

    fn ctx(&self, batch: usize, time: usize, device: &Device) -> Result<block::Ctx> {
        Ok(block::Ctx {
            batch,
            time,
            n_head: self.cfg.n_head,
            eps: self.cfg.layer_norm_epsilon,
            act: self.act,
            dropout: self.dropout,
            bias: LazyBias::new(batch, time, device), // (B, 1, T, T)
        })
    }
}
/// Each row's loss gradient for the mean over `m` rows at `loss_scale`.
fn row_grad(loss_scale: f64, m: usize) -> f32 {
    (loss_scale / m as f64) as f32
}

/// `head` (V, C) with zero rows to the loss's padding on its device ([`head_padding`]), (V', C).
fn padded_head(head: &Tensor) -> Result<Tensor> {
    let (v, c) = head.dims2()?;
    let pad = v.next_multiple_of(head_padding(head.device())) - v;
    if pad == 0 {
        return Ok(head.clone());
    }
    let zeros = Tensor::zeros((pad, c), head.dtype(), head.device())?;
    Tensor::cat(&[head, &zeros], 0)
}

#[cfg(test)]
mod tests;
