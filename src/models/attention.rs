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

/// Largest batch (B·nh matrices, B·nh·T·T score elements) one attention call handles; larger
/// batches run in slices of B. Past 65 535 matrices (CUDA's grid-y limit) or 2³¹ score
/// elements (32-bit indexing) a batch-2048 bloom-7b1 step stalled on H100 and H200 for minutes
/// (results/README.md); slicing costs nothing measurable at these sizes.
const MAX_ATTENTION_MATRICES: usize = 65_535;
const MAX_SCORE_ELEMENTS: usize = (1 << 31) - 1;

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
    let (b, nh, t, _) = q.dims4()?;
    let rows = slice_rows(nh, t, MAX_ATTENTION_MATRICES, MAX_SCORE_ELEMENTS);
    if b <= rows {
        return attention_core(q, k, v, bias, scale, mode);
    }
    // Slices of the batch; a bias with a batch dimension of 1 broadcasts to every slice.
    let bias_per_row = bias.dim(0)? == b;
    let mut outs = vec![];
    for start in (0..b).step_by(rows) {
        let n = rows.min(b - start);
        let part = |x: &Tensor| x.narrow(0, start, n);
        let bias = if bias_per_row {
            part(bias)?
        } else {
            bias.clone()
        };
        outs.push(attention_core(
            &part(q)?,
            &part(k)?,
            &part(v)?,
            &bias,
            scale,
            mode,
        )?);
    }
    Tensor::cat(&outs, 0) // (B, nh, T, hs)
}

/// Rows of the batch per attention call under both limits (at least 1).
fn slice_rows(nh: usize, t: usize, max_matrices: usize, max_elements: usize) -> usize {
    (max_matrices / nh.max(1))
        .min(max_elements / (nh * t * t).max(1))
        .max(1)
}

fn attention_core(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_respect_both_limits() {
        // bloom-7b1 (32 heads) at T = 180: 2047 rows by matrices, 2071 by elements.
        assert_eq!(
            slice_rows(32, 180, MAX_ATTENTION_MATRICES, MAX_SCORE_ELEMENTS),
            2047
        );
        assert_eq!(
            slice_rows(32, 400, MAX_ATTENTION_MATRICES, MAX_SCORE_ELEMENTS),
            419
        );
        assert_eq!(slice_rows(1, 100_000, 10, 10), 1);
    }

    #[test]
    fn sliced_attention_equals_one_call() -> Result<()> {
        let dev = Device::Cpu;
        let (b, nh, t, hs) = (5, 2, 4, 3);
        let q = Tensor::randn(0f32, 1., (b, nh, t, hs), &dev)?;
        let k = Tensor::randn(0f32, 1., (b, nh, t, hs), &dev)?;
        let v = Tensor::randn(0f32, 1., (b, nh, t, hs), &dev)?;
        let mask = Tensor::new(&[[1u32, 1, 1, 0]; 5], &dev)?;
        let bias = causal_padding_bias(&mask)?;
        let whole = attention_core(&q, &k, &v, &bias, 0.5, Mode::default())?;
        // Two rows a call, as the limits would give for a large batch.
        let parts: Vec<Tensor> = (0..b)
            .step_by(2)
            .map(|s| {
                let n = 2.min(b - s);
                let p = |x: &Tensor| x.narrow(0, s, n);
                attention_core(&p(&q)?, &p(&k)?, &p(&v)?, &p(&bias)?, 0.5, Mode::default())
            })
            .collect::<Result<_>>()?;
        let diff = (Tensor::cat(&parts, 0)? - whole)?.abs()?.max_all()?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.);
        Ok(())
    }
}
