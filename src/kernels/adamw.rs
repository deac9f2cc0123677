//! AdamW in two passes per parameter instead of ~12 ops, and the gradient norm's Σ x² in one
//! (`--fused adamw`; kernels in adamw.cu). The step follows torch's single-tensor order, as
//! `train::AdamW` does with candle's ops.
//!
//! Shapes: n = a parameter's element count. param, grad (n,) flat (any shape outside);
//! mv (2, n) f32, the first and second moments; Σ x² (1,) f32.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// AdamW hyper-parameters of one step (see `train::AdamW`).
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// 1 − β1ᵗ and √(1 − β2ᵗ).
    pub bc1: f64,
    pub bc2_sqrt: f64,
    /// Multiplies every gradient first: the clip coefficient (over a loss scale). Folded into
    /// the kernel instead of one more pass per tensor.
    pub grad_scale: f64,
}

/// Σ x² over a whole tensor as a (1,) f32 tensor, in one pass (with `adamw`: the gradient
/// norm before the step, instead of a square and a sum per tensor).
pub fn sum_squares(x: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Adamw) {
        return Ok(None);
    }
    imp::sum_squares(x)
}

/// One AdamW step of `param` (updated in place) with gradient `grad · grad_scale`; `mv`
/// (2, numel) f32 holds the moments. Returns the new moments.
pub fn adamw(param: &Tensor, grad: &Tensor, mv: &Tensor, h: &AdamStep) -> Result<Option<Tensor>> {
    if !enabled(Fused::Adamw) {
        return Ok(None);
    }
    imp::adamw(param, grad, mv, h)
}

/// The CPU runs `train::AdamW`'s candle ops.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::AdamStep;
    use candle_core::{Result, Tensor};

    pub fn sum_squares(_: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn adamw(_: &Tensor, _: &Tensor, _: &Tensor, _: &AdamStep) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::AdamStep;
    use crate::kernels::launch::{
        alloc, flat_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{
        bail, CudaStorage, CustomOp1, CustomOp2, DType, InplaceOp2, Layout, Result, Shape, Tensor,
    };

    const PTX: Ptx = ptx!("adamw");

    /// mv' from mv (2, n) f32 and the gradient (times grad_scale).
    struct AdamMoments {
        beta1: f32,
        beta2: f32,
        grad_scale: f32,
    }

    impl CustomOp2 for AdamMoments {
        fn name(&self) -> &'static str {
            "tb-adam-moments"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            mv: &CudaStorage,
            mvl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = mv.device().clone();
            let n = gl.shape().elem_count();
            let func = kernel!(dev, PTX, "tb_adam_moments", g.dtype())?;
            with_dtype!(g.dtype(), T => {
                let (mvv, gv) = (view::<f32>(mv, mvl)?, view::<T>(g, gl)?);
                let out = alloc::<f32>(&dev, 2 * n)?;
                let n_i = n as i64;
                // SAFETY: mv and out hold 2n elements, g holds n.
                launch!(unsafe func, flat_config(n);
                    &mvv, &gv, &out, &n_i, &self.beta1, &self.beta2, &self.grad_scale)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), mvl.shape().clone()))
            })
        }
    }

    /// p ← p·decay − step_size · m / (√v / bc2_sqrt + ε), in place.
    struct AdamApply {
        decay: f32,
        step_size: f32,
        bc2_sqrt: f32,
        eps: f32,
    }

    impl InplaceOp2 for AdamApply {
        fn name(&self) -> &'static str {
            "tb-adamw-apply"
        }
        no_cpu_fwd!(InplaceOp2);
        fn cuda_fwd(
            &self,
            p: &mut CudaStorage,
            pl: &Layout,
            mv: &CudaStorage,
            mvl: &Layout,
        ) -> Result<()> {
            let dev = p.device().clone();
            let n = pl.shape().elem_count();
            let func = kernel!(dev, PTX, "tb_adamw_apply", p.dtype())?;
            let mvv = view::<f32>(mv, mvl)?;
            if !pl.is_contiguous() {
                bail!("fused AdamW: parameter is not contiguous");
            }
            with_dtype!(p.dtype(), T => {
                let off = pl.start_offset();
                let mut pv = T::as_cuda_slice_mut(p)?.slice_mut(off..off + n);
                let n_i = n as i64;
                // SAFETY: p holds n elements from its offset, mv 2n.
                launch!(unsafe func, flat_config(n); &mut pv, &mvv, &n_i, &self.decay,
                    &self.step_size, &self.bc2_sqrt, &self.eps)?;
                Ok(())
            })
        }
    }

    /// Σ x² of a whole tensor, (1,) f32.
    struct SumSquares;

    impl CustomOp1 for SumSquares {
        fn name(&self) -> &'static str {
            "tb-sum-squares"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let n = xl.shape().elem_count();
            let func = kernel!(dev, PTX, "tb_sum_squares", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let xv = view::<T>(x, xl)?;
                let out = dev.alloc_zeros::<f32>(1)?;
                let n_i = n as i64;
                // SAFETY: x holds n elements, out one.
                launch!(unsafe func, flat_config(n); &xv, &out, &n_i)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(1)))
            })
        }
    }

    pub fn sum_squares(x: &Tensor) -> Result<Option<Tensor>> {
        if !x.device().is_cuda() || !float_dtype(x) {
            return Ok(None);
        }
        Ok(Some(x.contiguous()?.apply_op1_no_bwd(&SumSquares)?))
    }

    pub fn adamw(
        param: &Tensor,
        grad: &Tensor,
        mv: &Tensor,
        h: &AdamStep,
    ) -> Result<Option<Tensor>> {
        if !param.device().is_cuda() || !float_dtype(param) || grad.dtype() != param.dtype() {
            return Ok(None);
        }
        if !(param.is_contiguous() && mv.is_contiguous()) || mv.dtype() != DType::F32 {
            return Ok(None);
        }
        let g = grad.contiguous()?.flatten_all()?;
        let moments = AdamMoments {
            beta1: h.beta1 as f32,
            beta2: h.beta2 as f32,
            grad_scale: h.grad_scale as f32,
        };
        let mv = mv.apply_op2_no_bwd(&g, &moments)?;
        let apply = AdamApply {
            decay: (1. - h.lr * h.weight_decay) as f32,
            step_size: (h.lr / h.bc1) as f32,
            bc2_sqrt: h.bc2_sqrt as f32,
            eps: h.eps as f32,
        };
        param.inplace_op2(&mv, &apply)?;
        Ok(Some(mv))
    }
}
