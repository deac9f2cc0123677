//! The attention core GPT-2 and BLOOM share: scaled dot-product attention over an additive
//! f32 bias that carries the causal mask, the key-padding mask and (for BLOOM) ALiBi.
//!
//! Shapes: `B` batch, `nh` heads, `T` time, `hs` head size.

use super::layers::{dropout, softmax_last_dim, Mode};
use candle_core::{DType, Device, Result, Tensor, D};

/// Added to scores of keys a query must not see. Finite (not -inf) so that a row with every
/// key masked, such as a padded query, gives a uniform softmax instead of NaN; exp() of it
/// underflows to exactly 0 next to any real score.
pub const MASKED: f32 = -1e9;

/// Causal + key-padding bias, (B, 1, T, T) f32: 0 where query `t` may attend key `s`
/// (`s <= t` and `attention_mask[b, s] == 1`), [`MASKED`] elsewhere.
/// `attention_mask`: (B, T), 1 for real tokens, 0 for padding.
pub fn causal_padding_bias(attention_mask: &Tensor) -> Result<Tensor> {
    let (b, t) = attention_mask.dims2()?;
    let device = attention_mask.device();
    let causal: Vec<f32> = (0..t)
        .flat_map(|q| (0..t).map(move |k| if k <= q { 0. } else { MASKED }))
        .collect();
    let causal = Tensor::from_vec(causal, (1, 1, t, t), device)?;
    // (1 - mask) * MASKED: 0 for real keys, MASKED for padding.
    let keys = attention_mask
        .to_dtype(DType::F32)?
        .affine(-(MASKED as f64), MASKED as f64)?
        .reshape((b, 1, 1, t))?;
    causal.broadcast_add(&keys)
}

/// softmax(q kᵀ · scale + bias) v, the softmax in f32 whatever the model dtype (as HF BLOOM;
/// for GPT-2 in fp32 this is exactly HF's eager path).
/// In training mode the probabilities go through attention dropout (as HF).
/// q, k, v: (B, nh, T, hs); bias: f32, broadcastable to (B, nh, T, T). Returns (B, nh, T, hs).
pub fn scaled_dot_product(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
    mode: Mode,
) -> Result<Tensor> {
    let scores = (q.matmul(&k.t()?)? * scale)?; // (B, nh, T, T)
    let scores = scores.to_dtype(DType::F32)?.broadcast_add(bias)?;
    let probs = softmax_last_dim(&scores, mode)?.to_dtype(v.dtype())?;
    dropout(&probs, mode.dropout.attn)?.matmul(v)
}

/// (B, T, nh·hs) -> (B, nh, T, hs), contiguous for the batched matmul.
pub fn split_heads(x: &Tensor, n_head: usize) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    x.reshape((b, t, n_head, c / n_head))?
        .transpose(1, 2)? // (B, nh, T, hs)
        .contiguous()
}

/// (B, nh, T, hs) -> (B, T, nh·hs).
pub fn merge_heads(x: &Tensor) -> Result<Tensor> {
    let (b, nh, t, hs) = x.dims4()?;
    x.transpose(1, 2)? // (B, T, nh, hs)
        .reshape((b, t, nh * hs))
}

/// log-softmax over the vocabulary in f32. logits: (N, V) -> (N, V) f32.
pub fn log_softmax_f32(logits: &Tensor) -> Result<Tensor> {
    candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)
}

/// Position ids 0..T on `device`, (T,) u32.
pub fn positions(t: usize, device: &Device) -> Result<Tensor> {
    Tensor::arange(0u32, t as u32, device)
}
