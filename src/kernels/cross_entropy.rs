//! Training loss (`--fused cross-entropy`; kernels in cross_entropy.cu): cross-entropy over
//! the logits in one kernel each way, f32 inside, no f32 copy of the logits.
//!
//! Shapes: N rows (tokens), V the vocabulary, ld ≥ V the logits' row length (a padded lm head).
//!   logits, dlogits (N, ld); targets (N,) u32; loss, its gradient (N,) f32

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// −log softmax(logits)[target] per row over the first `vocab` columns: logits (N, V ≥ vocab)
/// (a padded lm head's extra columns are ignored and get zero gradient), targets (N,) u32 ->
/// (N,) f32, differentiable w.r.t. the logits (the backward recomputes the log-sum-exp).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, vocab: usize) -> Result<Option<Tensor>> {
    if !enabled(Fused::CrossEntropy) {
        return Ok(None);
    }
    imp::cross_entropy(logits, targets, vocab)
}

/// The backward of [`cross_entropy`] as its own entry point (the manual training step calls
/// it): g_i · (softmax(logits_i) − onehot(target_i)) for per-row gradients g (N,) f32, as
/// (N, ld) in the logits' dtype, 0 in the padded columns.
pub fn cross_entropy_bwd(
    logits: &Tensor,
    targets: &Tensor,
    g: &Tensor,
    vocab: usize,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::CrossEntropy) {
        return Ok(None);
    }
    imp::cross_entropy_bwd(logits, targets, g, vocab)
}

/// [`cross_entropy_bwd`] written over `logits` itself: the training step's (N, ld) logits are
/// not read again, and their gradient no longer needs a second buffer at the step's peak
/// (0.8 GB for gpt2 at 8 × 1024). Returns whether it applied; the caller must own `logits`'
/// storage alone (no other tensor sees it change).
pub fn cross_entropy_bwd_in_place(
    logits: &Tensor,
    targets: &Tensor,
    g: &Tensor,
    vocab: usize,
) -> Result<bool> {
    if !enabled(Fused::CrossEntropy) {
        return Ok(false);
    }
    imp::cross_entropy_bwd_in_place(logits, targets, g, vocab)
}

/// The forward and backward in one pass (the training step): the per-row loss (N,) f32 of
/// [`cross_entropy`], the logits overwritten with [`cross_entropy_bwd`]'s gradient for the
/// same `g` on every row, bit for bit as the two kernels would give. None where it does not
/// apply (the logits then untouched); the caller must own the logits' storage alone.
pub fn cross_entropy_fused_in_place(
    logits: &Tensor,
    targets: &Tensor,
    g: f32,
    vocab: usize,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::CrossEntropy) {
        return Ok(None);
    }
    imp::cross_entropy_fused_in_place(logits, targets, g, vocab)
}

/// The CPU runs candle's log-softmax and gather.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn cross_entropy_bwd_in_place(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: usize,
    ) -> Result<bool> {
        Ok(false)
    }

    pub fn cross_entropy(_: &Tensor, _: &Tensor, _: usize) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn cross_entropy_fused_in_place(
        _: &Tensor,
        _: &Tensor,
        _: f32,
        _: usize,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn cross_entropy_bwd(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: usize,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::launch::{
        alloc, device_address, float_dtype, kernel, launch, no_cpu_fwd, ptx, row_config, view,
        with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{
        bail, CudaStorage, CustomOp2, CustomOp3, DType, InplaceOp2, InplaceOp3, Layout, Result,
        Shape, Tensor,
    };

    const PTX: Ptx = ptx!("cross_entropy");

    /// Per-row loss (N,) f32 of logits (N, ld) and targets (N,) u32 over the first `vocab` columns.
    #[derive(Clone, Copy)]
    struct CrossEntropy {
        vocab: usize,
    }

    impl CustomOp2 for CrossEntropy {
        fn name(&self) -> &'static str {
            "tb-cross-entropy"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            t: &CudaStorage,
            tl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, ld) = xl.shape().dims2()?;
            let func = kernel!(dev, PTX, "tb_xent_fwd", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (xv, tv) = (view::<T>(x, xl)?, view::<u32>(t, tl)?);
                let out = alloc::<f32>(&dev, rows)?;
                let (v_i, ld_i) = (self.vocab as i32, ld as i32);
                // SAFETY: x holds rows·V elements, targets and out rows.
                launch!(unsafe func, row_config(rows, ld); &xv, &tv, &out, &v_i, &ld_i)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(rows)))
            })
        }
        fn bwd(
            &self,
            x: &Tensor,
            t: &Tensor,
            _loss: &Tensor,
            grad: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            let g = grad.to_dtype(DType::F32)?.contiguous()?;
            let op = CrossEntropyGrad { vocab: self.vocab };
            Ok((Some(x.apply_op3_no_bwd(t, &g, &op)?), None))
        }
    }

    /// dx = g · (softmax(x) − onehot(target)) over the vocabulary, 0 in padded columns.
    struct CrossEntropyGrad {
        vocab: usize,
    }

    impl CustomOp3 for CrossEntropyGrad {
        fn name(&self) -> &'static str {
            "tb-cross-entropy-grad"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            t: &CudaStorage,
            tl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, ld) = xl.shape().dims2()?;
            let func = kernel!(dev, PTX, "tb_xent_bwd", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (xv, tv, gv) = (view::<T>(x, xl)?, view::<u32>(t, tl)?, view::<f32>(g, gl)?);
                let out = alloc::<T>(&dev, rows * ld)?;
                let (v_i, ld_i) = (self.vocab as i32, ld as i32);
                // SAFETY: x and out hold rows·ld elements, targets and g rows.
                launch!(unsafe func, row_config(rows, ld); &xv, &tv, &gv, &out, &v_i, &ld_i)?;
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
    }

    /// x ← g · (softmax(x) − onehot(target)), in place.
    struct CrossEntropyGradInPlace {
        vocab: usize,
    }

    impl InplaceOp3 for CrossEntropyGradInPlace {
        fn name(&self) -> &'static str {
            "tb-cross-entropy-grad-in-place"
        }
        no_cpu_fwd!(InplaceOp3);
        fn cuda_fwd(
            &self,
            x: &mut CudaStorage,
            xl: &Layout,
            t: &CudaStorage,
            tl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> Result<()> {
            let dev = x.device().clone();
            let (rows, ld) = xl.shape().dims2()?;
            if !xl.is_contiguous() {
                bail!("cross-entropy in place: logits are not contiguous");
            }
            let func = kernel!(dev, PTX, "tb_xent_bwd_inplace", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (tv, gv) = (view::<u32>(t, tl)?, view::<f32>(g, gl)?);
                let off = xl.start_offset();
                let mut xv = T::as_cuda_slice_mut(x)?.slice_mut(off..off + rows * ld);
                let (v_i, ld_i) = (self.vocab as i32, ld as i32);
                // SAFETY: x holds rows·ld elements from its offset, targets and g rows.
                launch!(unsafe func, row_config(rows, ld); &mut xv, &tv, &gv, &v_i, &ld_i)?;
                Ok(())
            })
        }
    }

    /// The loss (N,) f32 written at `loss` and the gradient for `g` written over the logits.
    struct CrossEntropyFused {
        vocab: usize,
        g: f32,
        loss: u64,
    }

    impl InplaceOp2 for CrossEntropyFused {
        fn name(&self) -> &'static str {
            "tb-cross-entropy-fused"
        }
        no_cpu_fwd!(InplaceOp2);
        fn cuda_fwd(
            &self,
            x: &mut CudaStorage,
            xl: &Layout,
            t: &CudaStorage,
            tl: &Layout,
        ) -> Result<()> {
            let dev = x.device().clone();
            let (rows, ld) = xl.shape().dims2()?;
            if !xl.is_contiguous() || tl.shape().elem_count() != rows {
                bail!(
                    "cross-entropy fused: logits {:?}, targets {:?}",
                    xl.shape(),
                    tl.shape()
                );
            }
            let func = kernel!(dev, PTX, "tb_xent_fused", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let tv = view::<u32>(t, tl)?;
                let off = xl.start_offset();
                let mut xv = T::as_cuda_slice_mut(x)?.slice_mut(off..off + rows * ld);
                let (v_i, ld_i) = (self.vocab as i32, ld as i32);
                // SAFETY: x holds rows·ld elements from its offset, targets and loss rows.
                launch!(unsafe func, row_config(rows, ld); &mut xv, &tv, &self.loss, &self.g,
                    &v_i, &ld_i)?;
                Ok(())
            })
        }
    }

    /// Whether the kernels take these logits (N, ld) on CUDA and targets (N,) u32; an error for
    /// a vocabulary the logits cannot hold.
    fn applies(logits: &Tensor, targets: &Tensor, vocab: usize) -> Result<bool> {
        let ok_targets = targets.dtype() == DType::U32 && targets.rank() == 1;
        let usable = logits.device().is_cuda() && float_dtype(logits) && logits.rank() == 2;
        if !(usable && ok_targets) {
            return Ok(false);
        }
        if vocab == 0 || vocab > logits.dim(1)? {
            bail!(
                "cross-entropy: vocabulary {vocab} for logits {:?}",
                logits.shape()
            );
        }
        Ok(true)
    }

    pub fn cross_entropy_bwd_in_place(
        logits: &Tensor,
        targets: &Tensor,
        g: &Tensor,
        vocab: usize,
    ) -> Result<bool> {
        if !logits.is_contiguous() || !applies(logits, targets, vocab)? {
            return Ok(false);
        }
        let t = targets.contiguous()?;
        let g = g.to_dtype(DType::F32)?.contiguous()?;
        logits.inplace_op3(&t, &g, &CrossEntropyGradInPlace { vocab })?;
        Ok(true)
    }

    pub fn cross_entropy_fused_in_place(
        logits: &Tensor,
        targets: &Tensor,
        g: f32,
        vocab: usize,
    ) -> Result<Option<Tensor>> {
        if !logits.is_contiguous() || !applies(logits, targets, vocab)? {
            return Ok(None);
        }
        let t = targets.contiguous()?;
        let loss = Tensor::zeros(t.elem_count(), DType::F32, logits.device())?;
        let op = CrossEntropyFused {
            vocab,
            g,
            loss: device_address(&loss)?,
        };
        logits.inplace_op2(&t, &op)?;
        Ok(Some(loss))
    }

    pub fn cross_entropy(
        logits: &Tensor,
        targets: &Tensor,
        vocab: usize,
    ) -> Result<Option<Tensor>> {
        if !applies(logits, targets, vocab)? {
            return Ok(None);
        }
        let (x, t) = (logits.contiguous()?, targets.contiguous()?);
        Ok(Some(x.apply_op2(&t, CrossEntropy { vocab })?))
    }

    pub fn cross_entropy_bwd(
        logits: &Tensor,
        targets: &Tensor,
        g: &Tensor,
        vocab: usize,
    ) -> Result<Option<Tensor>> {
        if !applies(logits, targets, vocab)? {
            return Ok(None);
        }
        let (x, t) = (logits.contiguous()?, targets.contiguous()?);
        let g = g.to_dtype(DType::F32)?.contiguous()?;
        Ok(Some(x.apply_op3_no_bwd(
            &t,
            &g,
            &CrossEntropyGrad { vocab },
        )?))
    }
}
