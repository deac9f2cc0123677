//! The attention core of the manual step: softmax(q kᵀ·scale + bias) (dropout) v, keeping the
//! probabilities for the backward instead of recomputing them (the autograd path recomputes:
//! `models::attention::recomputed_attention`), and its backward as FlashAttention's: five
//! matmuls and one row-wise pass (`kernels::attn_softmax_bwd` on CUDA).
//!
//! On CUDA (bf16 / f16, head size 64) both directions are instead one fused kernel family
//! (`kernels::flash_attention`, `--fused flash`) that keeps no probabilities, dropout included
//! when its mask is hashed (`--fused dropout`): the backward redraws it.
//!
//! Shapes: `B` batch, `T` time, `nh` heads, `hs` head size, `C` = nh·hs; the scores and
//! probabilities (B, nh, T, T); the bias (B, 1, T, T) f32 (the causal mask: the manual step
//! trains unpadded rows only, which is what lets the fused kernels apply it themselves).

use crate::kernels::{self, Keep};
use crate::models::attention::causal_padding_bias;
use candle_core::{bail, DType, Device, Result, Shape, Tensor, D};
use std::sync::OnceLock;

/// The composed path's causal bias, made from its (B, T) shape and device when first asked
/// for (the fused kernels never ask).
pub struct LazyBias {
    shape: (usize, usize),
    device: Device,
    made: OnceLock<Tensor>,
}

impl LazyBias {
    pub fn new(batch: usize, time: usize, device: &Device) -> Self {
        Self {
            shape: (batch, time),
            device: device.clone(),
            made: OnceLock::new(),
        }
    }

    /// The bias (B, 1, T, T) f32 of causal rows without padding.
    pub fn get(&self) -> Result<Tensor> {
        if let Some(b) = self.made.get() {
            return Ok(b.clone());
        }
        let mask = Tensor::ones(self.shape, DType::U32, &self.device)?;
        let bias = causal_padding_bias(&mask)?;
        Ok(self.made.get_or_init(|| bias).clone())
    }
}

impl Kept {
    /// The dropout mask this forward drew (None without dropout).
    pub fn keep(&self) -> Option<Keep> {
        match self {
            Kept::Composed(c) => c.keep.as_ref().map(|(k, _)| k.clone()),
            Kept::Flash { keep, .. } => keep.as_ref().map(|(k, _)| k.clone()),
        }
    }
}

/// What the backward reads of the forward.
pub enum Kept {
    Composed(Composed),
    /// The fused kernels': the input, the output, a log-sum-exp a row and the dropout mask.
    Flash {
        qkv: Tensor, // (B, T, 3C)
        y: Tensor,   // (B·T, C)
        lse: Tensor, // (B, nh, T) f32
        keep: Option<(Keep, f32)>,
    },
}

/// The matmul path's: the heads split, the probabilities and the mask.
pub struct Composed {
    q: Tensor, // (B, nh, T, hs)
    k: Tensor,
    v: Tensor,
    /// Before dropout: f32 on the composed path, the model dtype from the fused kernel.
    probs: Tensor,
    /// After dropout, in the model dtype (the P·V matmul's operand); `probs` without dropout.
    dropped: Tensor,
    keep: Option<(Keep, f32)>,
}

/// The attention of the projection's output qkv (B, T, 3C) = [q | k | v] with `nh` heads:
/// (y (B·T, C) with the heads merged, what the backward needs). `p_drop` > 0: dropout on the
/// probabilities with a mask drawn here (the draw the autograd path makes at this point), or
/// `redraw`, the one an earlier forward of this block drew (`--recompute`).
pub fn attention(
    qkv: &Tensor,
    nh: usize,
    bias: &LazyBias,
    scale: f64,
    p_drop: f32,
    redraw: Option<Option<Keep>>,
) -> Result<(Tensor, Kept)> {
    let (b, t, c3) = qkv.dims3()?;
    let nh_t: Shape = (b, nh, t, t).into();
    let keep = match (redraw, p_drop > 0.) {
        (Some(keep), _) => keep.map(|k| (k, p_drop)),
        (None, true) => Some((kernels::draw_keep(&nh_t, p_drop, qkv.device())?, p_drop)),
        (None, false) => None,
    };
    let keep_ref = keep.as_ref().map(|(k, p)| (k, *p));
    if let Some((y, lse)) = kernels::flash_attention(qkv, nh, scale, keep_ref)? {
        let y = y.reshape((b * t, c3 / 3))?;
        let kept = Kept::Flash {
            qkv: qkv.clone(),
            y: y.clone(),
            lse,
            keep,
        };
        return Ok((y, kept));
    }
    let hs = c3 / 3 / nh;
    let qkv = match kernels::split_heads(qkv, 3, nh)? {
        Some(split) => split,
        None => qkv
            .reshape((b, t, 3, nh, hs))?
            .permute((2, 0, 3, 1, 4))?
            .contiguous()?,
    }; // (3, B, nh, T, hs)
    let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
    let s = q.matmul(&k.t()?)?; // (B, nh, T, T)
    let (probs, dropped) = softmax(&s, &bias.get()?, scale, &keep, v.dtype())?;
    let y = dropped.matmul(&v)?; // (B, nh, T, hs)
    let y = match kernels::merge_heads(&[&y])? {
        Some(merged) => merged,
        None => y.transpose(1, 2)?.reshape((b * t, nh * hs))?,
    }; // (B·T, C)
    let kept = Kept::Composed(Composed {
        q,
        k,
        v,
        probs,
        dropped,
        keep,
    });
    Ok((y, kept))
}

/// (probabilities, dropped probabilities in `dtype`) of the raw scores s (B, nh, T, T).
fn softmax(
    s: &Tensor,
    bias: &Tensor,
    scale: f64,
    keep: &Option<(Keep, f32)>,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let keep_ref = keep.as_ref().map(|(k, p)| (k, *p));
    if let Some((dropped, Some(probs))) = kernels::attn_softmax(s, bias, scale, keep_ref, true)? {
        return Ok((probs, dropped));
    }
    // The autograd path's composed ops: scale in the model dtype, bias and softmax in f32.
    let scores = (s * scale)?.to_dtype(DType::F32)?.broadcast_add(bias)?;
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let dropped = match keep {
        Some((k, p)) => kernels::apply_keep(&probs, k, *p)?,
        None => probs.clone(),
    };
    Ok((probs, dropped.to_dtype(dtype)?))
}

/// dqkv (B·T, 3C) = [dq | dk | dv] of [`attention`] from dy (B·T, C), the gradient of its
/// merged output.
pub fn attention_bwd(kept: &Kept, dy: &Tensor, scale: f64) -> Result<Tensor> {
    let kept = match kept {
        Kept::Composed(c) => c,
        Kept::Flash { qkv, y, lse, keep } => {
            let (b, t, c3) = qkv.dims3()?;
            let keep = keep.as_ref().map(|(k, p)| (k, *p));
            return match kernels::flash_attention_bwd(qkv, y, lse, dy, scale, keep)? {
                Some(dqkv) => dqkv.reshape((b * t, c3)),
                None => bail!("the fused attention's backward no longer applies"),
            };
        }
    };
    let (b, nh, t, hs) = kept.q.dims4()?;
    let dy = dy.reshape((b, t, nh * hs))?;
    let dout = match kernels::split_heads(&dy, 1, nh)? {
        Some(split) => split.squeeze(0)?,
        None => dy.reshape((b, t, nh, hs))?.transpose(1, 2)?.contiguous()?,
    }; // (B, nh, T, hs)
    let dv = kept.dropped.t()?.matmul(&dout)?;
    let d_dropped = dout.matmul(&kept.v.t()?)?; // (B, nh, T, T)
    let ds = softmax_bwd(kept, &d_dropped, scale)?; // d/ds of the raw scores
    let dq = ds.matmul(&kept.k)?;
    let dk = ds.t()?.matmul(&kept.q)?;
    if let Some(dqkv) = kernels::merge_heads(&[&dq, &dk, &dv])? {
        return Ok(dqkv);
    }
    Tensor::stack(&[dq, dk, dv], 0)? // (3, B, nh, T, hs)
        .permute((1, 3, 0, 2, 4))? // (B, T, 3, nh, hs)
        .reshape((b * t, 3 * nh * hs))
}

/// ds = scale · P ⊙ (dP − Σ_row P ⊙ dP), dP = d_dropped ⊙ keep / (1 − p), in d_dropped's dtype.
fn softmax_bwd(kept: &Composed, d_dropped: &Tensor, scale: f64) -> Result<Tensor> {
    let keep_ref = kept.keep.as_ref().map(|(k, p)| (k, *p));
    if let Some(ds) = kernels::attn_softmax_bwd(&kept.probs, d_dropped, scale, keep_ref)? {
        return Ok(ds);
    }
    let dp = d_dropped.to_dtype(DType::F32)?;
    let dp = match &kept.keep {
        Some((k, p)) => kernels::apply_keep(&dp, k, *p)?,
        None => dp,
    };
    let p = kept.probs.to_dtype(DType::F32)?;
    let row = (&p * &dp)?.sum_keepdim(D::Minus1)?; // (B, nh, T, 1)
    let dscores = (&p * dp.broadcast_sub(&row)?)?;
    // The forward scaled in the model dtype, before the cast to f32.
    dscores.to_dtype(d_dropped.dtype())? * scale
}
