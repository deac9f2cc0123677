//! Next-token cross-entropy as one differentiable op that keeps only the logits for its
//! backward. Autograd of candle's composed `log_softmax` + `nll` keeps four (N, V) f32 tensors
//! (6.6 GB for gpt2 at batch 8 × 1024) and walks them again in the backward.

use super::handoff::Handoff;
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};

/// The multiple the lm head's rows are padded to for the loss on `device`: 64 with the fused
/// loss on CUDA (GPT-2's V = 50257 would put the head's three matmuls on cuBLAS's slow
/// unaligned kernels: 15 ms of a gpt2 step on an H100, docs/perf-notes.md), else 1 (none).
pub fn head_padding(device: &candle_core::Device) -> usize {
    let fused = crate::kernels::enabled(crate::kernels::Fused::CrossEntropy);
    if device.is_cuda() && fused {
        64
    } else {
        1
    }
}

/// −log softmax(logits)[target] per row, in f32, over the first `vocab` columns (a padded lm
/// head's extra columns are not part of the softmax). logits: (N, V ≥ vocab) f32/bf16/f16;
/// targets: (N,) u32. Returns (N,) f32.
pub fn cross_entropy_rows(logits: &Tensor, targets: &Tensor, vocab: usize) -> Result<Tensor> {
    // On CUDA: one kernel each way over the logits in their own dtype.
    if let Some(loss) = crate::kernels::cross_entropy(logits, targets, vocab)? {
        return Ok(loss);
    }
    // gather below reads contiguous tensors only.
    let logits = &logits.narrow(1, 0, vocab)?.contiguous()?;
    let op = CrossEntropyRows {
        targets: targets.unsqueeze(1)?, // (N, 1)
        out: Handoff::default(),
    };
    let x = logits.detach().to_dtype(DType::F32)?; // (N, V)
    let max = x.max_keepdim(D::Minus1)?; // (N, 1)
    let lse = (x
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        + max)?;
    op.out.put((lse - x.gather(&op.targets, 1)?)?.squeeze(1)?);
    logits.apply_op1(op)
}

/// The gradient of [`cross_entropy_rows`] w.r.t. the logits for per-row loss gradients `g`
/// (N,) f32: g_i · (softmax(logits_i) − onehot(target_i)) over the first `vocab` columns, 0 in
/// the others, (N, V) in the logits' dtype. For a backward written by hand (no autograd).
pub fn cross_entropy_rows_grad(
    logits: &Tensor,
    targets: &Tensor,
    g: &Tensor,
    vocab: usize,
) -> Result<Tensor> {
    if let Some(d) = crate::kernels::cross_entropy_bwd(logits, targets, g, vocab)? {
        return Ok(d);
    }
    let (n, ld) = logits.dims2()?;
    let x = logits.narrow(1, 0, vocab)?.contiguous()?; // (N, vocab)
    let d = softmax_minus_onehot(&x, &targets.unsqueeze(1)?, g)?;
    if ld == vocab {
        return Ok(d);
    }
    let pad = Tensor::zeros((n, ld - vocab), d.dtype(), d.device())?;
    Tensor::cat(&[&d, &pad], 1) // (N, V)
}

/// g_i · (softmax(logits_i) − onehot(target_i)): logits (N, V), targets (N, 1) u32, g (N,)
/// -> (N, V) in the logits' dtype, softmax in f32.
fn softmax_minus_onehot(logits: &Tensor, targets: &Tensor, g: &Tensor) -> Result<Tensor> {
    let n = targets.dim(0)?;
    let probs = candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32)?)?; // (N, V)
    let minus_one = Tensor::full(-1f32, (n, 1), logits.device())?;
    probs.scatter_add_set(targets, &minus_one, 1)?;
    let d = probs.broadcast_mul(&g.to_dtype(DType::F32)?.unsqueeze(1)?)?;
    d.to_dtype(logits.dtype())
}

struct CrossEntropyRows {
    targets: Tensor, // (N, 1) u32
    out: Handoff,
}

impl CustomOp1 for CrossEntropyRows {
    fn name(&self) -> &'static str {
        "cross-entropy-rows"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        self.out.take_cpu()
    }

    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        self.out.take_cuda()
    }

    /// ∂nll_i/∂logits_ij = softmax(logits_i)_j − [j = target_i].
    fn bwd(&self, logits: &Tensor, _: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        softmax_minus_onehot(logits, &self.targets, grad).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn matches_candle_cross_entropy_and_its_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let logits = Var::from_tensor(&(Tensor::randn(0f32, 3., (6, 11), &dev)?))?;
        let targets = Tensor::new(&[0u32, 10, 3, 3, 7, 1], &dev)?;
        let ours = cross_entropy_rows(logits.as_tensor(), &targets, 11)?.mean_all()?;
        let reference = candle_nn::loss::cross_entropy(logits.as_tensor(), &targets)?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
        };
        assert!(diff(&ours, &reference)? < 1e-6);
        let g_ours = ours.backward()?.get(logits.as_tensor()).unwrap().clone();
        let g_ref = reference
            .backward()?
            .get(logits.as_tensor())
            .unwrap()
            .clone();
        assert!(diff(&g_ours, &g_ref)? < 1e-7, "{}", diff(&g_ours, &g_ref)?);
        Ok(())
    }
}
