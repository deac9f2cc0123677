//! The attention core GPT-2 and BLOOM share: scaled dot-product attention over an additive
//! f32 bias that carries the causal mask, the key-padding mask and (for BLOOM) ALiBi.
//!
//! Shapes: `B` batch, `nh` heads, `T` time, `hs` head size.

use super::handoff::Handoff;
use super::layers::Mode;
use crate::kernels::{self, Keep};
use candle_core::{
    CpuStorage, CudaStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, Var, D,
};
use std::sync::OnceLock;

/// Added to scores of keys a query must not see. Finite (not -inf) so that a row with every
/// key masked, such as a padded query, gives a uniform softmax instead of NaN; exp() of it
/// underflows to exactly 0 next to any real score.
pub const MASKED: f32 = -1e9;

/// Causal + key-padding bias, (B, 1, T, T) f32: 0 where query `t` may attend key `s`
/// (`s <= t` and `attention_mask[b, s] == 1`), [`MASKED`] elsewhere.
/// `attention_mask`: (B, T), 1 for real tokens, 0 for padding.
pub fn causal_padding_bias(attention_mask: &Tensor) -> Result<Tensor> {
    causal_padding_bias_last(attention_mask, attention_mask.dim(1)?)
}

/// [`causal_padding_bias`] of the last `tq` of Tk positions (a forward over a KV cache),
/// (B, 1, tq, Tk) f32: query `i`, at position Tk − tq + i, may attend key `s` when
/// `s <= Tk - tq + i` and `key_mask[b, s] == 1`. `key_mask`: (B, Tk), 1 real / 0 padding.
pub fn causal_padding_bias_last(key_mask: &Tensor, tq: usize) -> Result<Tensor> {
    let (b, tk) = key_mask.dims2()?;
    // (1 - mask) * MASKED: 0 for real keys, MASKED for padding.
    let keys = key_mask
        .to_dtype(DType::F32)?
        .affine(-(MASKED as f64), MASKED as f64)?
        .reshape((b, 1, 1, tk))?;
    if tq == 1 {
        return Ok(keys); // one query, the last position: it sees every key
    }
    let past = tk - tq;
    let causal: Vec<f32> = (0..tq)
        .flat_map(|q| (0..tk).map(move |k| if k <= past + q { 0. } else { MASKED }))
        .collect();
    let causal = Tensor::from_vec(causal, (1, 1, tq, tk), key_mask.device())?;
    causal.broadcast_add(&keys)
}

/// The keys of a forward over whole sequences (scoring): each row attends its sequence's
/// earlier positions. Right-padded rows of a batch, or the sequences packed end to end without
/// padding (only the fused kernel, [`kernels::prefill_applies`], takes those). The kernel takes
/// the sequences' rows; the composed path's bias is made from the mask when first asked for.
pub struct WholeSequences<'a> {
    /// (B,) u32: real tokens a sequence.
    lens: Tensor,
    /// (B,) u32: each sequence's first row, packed; None for padded rows.
    starts: Option<Tensor>,
    longest: usize,
    /// (B, T) u32: 1 real, 0 right padding; None packed.
    mask: Option<&'a Tensor>,
    bias: OnceLock<Tensor>,
}

impl<'a> WholeSequences<'a> {
    /// attention_mask: (B, T) u32, 1 for real tokens, 0 for right padding.
    pub fn new(attention_mask: &'a Tensor) -> Result<Self> {
        Ok(Self {
            lens: attention_mask.to_dtype(DType::U32)?.sum(1)?,
            starts: None,
            longest: attention_mask.dim(1)?,
            mask: Some(attention_mask),
            bias: OnceLock::new(),
        })
    }

    /// Sequences of `lens` tokens laid end to end (rows 0..Σ lens).
    pub fn packed(lens: &[usize], device: &Device) -> Result<Self> {
        let starts: Vec<u32> = lens
            .iter()
            .scan(0, |row, &n| {
                *row += n;
                Some((*row - n) as u32)
            })
            .collect();
        let n = lens.len();
        let lens_u32 = lens.iter().map(|&l| l as u32).collect();
        Ok(Self {
            lens: Tensor::from_vec(lens_u32, n, device)?,
            starts: Some(Tensor::from_vec(starts, n, device)?),
            longest: lens.iter().copied().max().unwrap_or(0),
            mask: None,
            bias: OnceLock::new(),
        })
    }

    /// The rows as the fused kernel takes them.
    pub fn rows(&self) -> kernels::SeqRows<'_> {
        kernels::SeqRows {
            lens: &self.lens,
            starts: self.starts.as_ref(),
            longest: self.longest,
        }
    }

    /// The composed path's bias, `make` of the (B, T) mask, made once; packed sequences have
    /// none (the fused kernel only).
    pub fn bias(&self, make: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        if let Some(b) = self.bias.get() {
            return Ok(b.clone());
        }
        let Some(mask) = self.mask else {
            candle_core::bail!("packed sequences need the fused attention (--fused prefill)")
        };
        let bias = make(mask)?;
        Ok(self.bias.get_or_init(|| bias).clone())
    }
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
    if mode.train {
        return recomputed_attention(q, k, v, bias, scale, mode.dropout.attn);
    }
    attend(q, k, v, bias, scale, None, false)
}

/// softmax(q kᵀ · scale + bias), then dropout with `keep` = (keep-mask over (B, nh, T, T), p),
/// times v. `differentiable`: the composed softmax (autograd), else the fused kernel.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
    differentiable: bool,
) -> Result<Tensor> {
    let raw = q.matmul(&k.t()?)?; // (B, nh, T, T)
    if !differentiable {
        // One kernel for scale, bias, softmax and dropout where it applies (CUDA).
        if let Some((probs, _)) = kernels::attn_softmax(&raw, bias, scale, keep, false)? {
            return probs.matmul(v);
        }
    }
    let scores = (raw * scale)?;
    let scores = scores.to_dtype(DType::F32)?.broadcast_add(bias)?;
    let probs = if differentiable {
        candle_nn::ops::softmax(&scores, D::Minus1)?
    } else {
        candle_nn::ops::softmax_last_dim(&scores)?
    };
    let probs = match keep {
        Some((keep, p)) => {
            let mask = kernels::keep_mask(keep, p, probs.shape(), probs.device())?;
            (probs * mask.to_dtype(DType::F32)?)?.affine(1. / (1. - p as f64), 0.)?
        }
        None => probs,
    };
    probs.to_dtype(v.dtype())?.matmul(v) // (B, nh, T, hs)
}

/// The attention core for training, differentiable, but keeping only q, k, v and the dropout
/// keep-mask (u8, or on CUDA only its hash key) for the backward instead of the six
/// (B, nh, T, T) f32 intermediates that autograd of the composed ops keeps per layer (about
/// 38 GB for gpt2 at batch 8 × 1024 in fp32). The backward recomputes the scores from q and
/// k, as memory-efficient attention does; the forward runs detached with the fused softmax
/// kernel.
fn recomputed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
    p_drop: f32,
) -> Result<Tensor> {
    let (b, nh, t, _) = q.dims4()?;
    // Drawn once, so the recompute in the backward sees the same mask as the forward.
    let keep = if p_drop > 0. {
        Some(kernels::draw_keep(
            &(b, nh, t, t).into(),
            p_drop,
            q.device(),
        )?) // (B, nh, T, T)
    } else {
        None
    };
    let op = RecomputedAttention {
        bias: bias.clone(),
        scale,
        keep,
        p_drop,
        out: Handoff::default(),
    };
    op.out
        .put(op.core(&q.detach(), &k.detach(), &v.detach(), false)?);
    q.apply_op3(k, v, op)
}

struct RecomputedAttention {
    bias: Tensor, // f32, broadcastable to (B, nh, T, T)
    scale: f64,
    keep: Option<Keep>, // over (B, nh, T, T)
    p_drop: f32,
    /// The output, computed before the op is applied.
    out: Handoff,
}

impl RecomputedAttention {
    fn core(&self, q: &Tensor, k: &Tensor, v: &Tensor, differentiable: bool) -> Result<Tensor> {
        let keep = self.keep.as_ref().map(|k| (k, self.p_drop));
        attend(q, k, v, &self.bias, self.scale, keep, differentiable)
    }
}

type QkvGrads = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

impl RecomputedAttention {
    /// The backward by hand with the fused softmax kernels (CUDA), as FlashAttention's:
    /// five matmuls and two row-wise passes, all in the model dtype, instead of autograd
    /// through the composed f32 ops. None where the kernels do not apply.
    fn fused_bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        dout: &Tensor,
    ) -> Result<Option<QkvGrads>> {
        let keep = self.keep.as_ref().map(|k| (k, self.p_drop));
        let (q, k, v) = (q.detach(), k.detach(), v.detach());
        let s = q.matmul(&k.t()?)?; // (B, nh, T, T)
        let Some((dropped, Some(probs))) =
            kernels::attn_softmax(&s, &self.bias, self.scale, keep, true)?
        else {
            return Ok(None);
        };
        let dout = dout.detach().contiguous()?; // (B, nh, T, hs)
        let dv = dropped.t()?.matmul(&dout)?;
        let d_dropped = dout.matmul(&v.t()?)?; // (B, nh, T, T)
        let Some(ds) = kernels::attn_softmax_bwd(&probs, &d_dropped, self.scale, keep)? else {
            return Ok(None);
        };
        let dq = ds.matmul(&k)?;
        let dk = ds.t()?.matmul(&q)?;
        Ok(Some((Some(dq), Some(dk), Some(dv))))
    }
}

impl CustomOp3 for RecomputedAttention {
    fn name(&self) -> &'static str {
        "recomputed-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.out.take_cpu()
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.out.take_cuda()
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if let Some(grads) = self.fused_bwd(q, k, v, grad_out)? {
            return Ok(grads);
        }
        let (q, k, v) = (
            Var::from_tensor(&q.detach())?,
            Var::from_tensor(&k.detach())?,
            Var::from_tensor(&v.detach())?,
        );
        let out = self.core(q.as_tensor(), k.as_tensor(), v.as_tensor(), true)?;
        let grads = (out * grad_out.detach())?.sum_all()?.backward()?;
        let get = |x: &Var| grads.get(x.as_tensor()).cloned();
        Ok((get(&q), get(&k), get(&v)))
    }
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

    fn qkv_bias() -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let dev = Device::Cpu;
        let shape = (2, 3, 5, 4); // (B, nh, T, hs)
        let q = Tensor::randn(0f32, 1., shape, &dev)?;
        let k = Tensor::randn(0f32, 1., shape, &dev)?;
        let v = Tensor::randn(0f32, 1., shape, &dev)?;
        let mask = Tensor::new(&[[1u32, 1, 1, 1, 1], [0, 1, 1, 1, 1]], &dev)?;
        Ok((q, k, v, causal_padding_bias(&mask)?))
    }

    /// Gradients of sum(out ⊙ g) through `attend` w.r.t. q, k, v.
    fn grads(
        attend: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let vars = [q, k, v].map(|t| Var::from_tensor(t).unwrap());
        let out = attend(
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
        )?;
        let store = (&out * g)?.sum_all()?.backward()?;
        let gs = vars
            .iter()
            .map(|x| store.get(x.as_tensor()).unwrap().clone());
        Ok((out, gs.collect()))
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
        d.max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    #[test]
    fn packed_sequences_start_where_the_one_before_ends() -> Result<()> {
        let whole = WholeSequences::packed(&[3, 1, 4], &Device::Cpu)?;
        let rows = whole.rows();
        assert_eq!(rows.lens.to_vec1::<u32>()?, [3, 1, 4]);
        assert_eq!(rows.starts.expect("packed").to_vec1::<u32>()?, [0, 3, 4]);
        assert_eq!(rows.longest, 4);
        assert!(whole.bias(causal_padding_bias).is_err(), "no composed path");
        let mask = Tensor::new(&[[1u32, 1, 0], [1, 0, 0]], &Device::Cpu)?;
        let padded = WholeSequences::new(&mask)?;
        assert_eq!(padded.rows().lens.to_vec1::<u32>()?, [2, 1]);
        assert!(padded.rows().starts.is_none());
        assert_eq!(padded.bias(causal_padding_bias)?.dims(), [2, 1, 3, 3]);
        Ok(())
    }

    #[test]
    fn recomputed_attention_matches_autograd_of_composed_ops() -> Result<()> {
        let (q, k, v, bias) = qkv_bias()?;
        let g = Tensor::randn(0f32, 1., q.shape(), q.device())?;
        let composed = |q: &Tensor, k: &Tensor, v: &Tensor| {
            let s = (q.matmul(&k.t()?)? * 0.5)?.broadcast_add(&bias)?;
            candle_nn::ops::softmax(&s, D::Minus1)?.matmul(v)
        };
        let recomputed =
            |q: &Tensor, k: &Tensor, v: &Tensor| recomputed_attention(q, k, v, &bias, 0.5, 0.);
        let (out_c, g_c) = grads(composed, &q, &k, &v, &g)?;
        let (out_r, g_r) = grads(recomputed, &q, &k, &v, &g)?;
        assert!(max_abs_diff(&out_c, &out_r) < 1e-6);
        for (a, b) in g_c.iter().zip(&g_r) {
            assert!(
                max_abs_diff(a, b) < 1e-5,
                "gradient differs by {}",
                max_abs_diff(a, b)
            );
        }
        Ok(())
    }

    /// out = P_drop v is linear in v, so Σ(∂/∂v · v) = Σ(out ⊙ g) only if the backward's
    /// recompute used the forward's dropout mask.
    #[test]
    fn recomputed_attention_backward_reuses_the_dropout_mask() -> Result<()> {
        let (q, k, v, bias) = qkv_bias()?;
        let g = Tensor::randn(0f32, 1., q.shape(), q.device())?;
        let attend =
            |q: &Tensor, k: &Tensor, v: &Tensor| recomputed_attention(q, k, v, &bias, 0.5, 0.5);
        let (out, gs) = grads(attend, &q, &k, &v, &g)?;
        let lhs = (&gs[2] * &v)?.sum_all()?.to_scalar::<f32>()?;
        let rhs = (&out * &g)?.sum_all()?.to_scalar::<f32>()?;
        assert!(
            (lhs - rhs).abs() < 1e-4 * rhs.abs().max(1.),
            "{lhs} vs {rhs}"
        );
        Ok(())
    }
}
