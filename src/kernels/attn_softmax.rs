//! Attention softmax (`--fused softmax`; kernels in attn_softmax.cu): the scale, the causal /
//! padding / ALiBi bias, the softmax and the dropout in one pass, and its backward in one more.
//!
//! Shapes: B batch, nh heads, Tq query and Tk key positions.
//!   s (raw scores q kᵀ), probabilities, their gradients: (B, nh, Tq, Tk)
//!   bias: (B, 1 | nh, Tq, Tk) f32; a stored keep-mask: u8 (B, nh, Tq, Tk)

use super::{enabled, Fused, Keep};
use candle_core::{Result, Tensor};

/// Dropped-out attention probabilities of raw scores s = q kᵀ, (B, nh, Tq, Tk):
/// softmax(scale·s + bias) ⊙ keep / (1 − p), with `keep` = (keep-mask, p). `bias`: f32,
/// (B, 1 | nh, Tq, Tk). With `with_probs`, also the probabilities before dropout (for the
/// backward). Not differentiable: the inference path, and the recompute of the training one.
pub fn attn_softmax(
    s: &Tensor,
    bias: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
    with_probs: bool,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if !enabled(Fused::Softmax) {
        return Ok(None);
    }
    imp::attn_softmax(s, bias, scale, keep, with_probs)
}

/// Gradient w.r.t. the raw scores s of [`attn_softmax`], from the probabilities `p` (before
/// dropout) and the gradient w.r.t. the dropped probabilities `dpd`.
pub fn attn_softmax_bwd(
    p: &Tensor,
    dpd: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::Softmax) {
        return Ok(None);
    }
    imp::attn_softmax_bwd(p, dpd, scale, keep)
}

/// The CPU runs candle's affine, broadcast add, softmax and dropout.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Keep;
    use candle_core::{Result, Tensor};

    pub fn attn_softmax(
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: Option<(&Keep, f32)>,
        _: bool,
    ) -> Result<Option<(Tensor, Option<Tensor>)>> {
        Ok(None)
    }
    pub fn attn_softmax_bwd(
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: Option<(&Keep, f32)>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Keep;
    use crate::kernels::dropout::imp::KeepArgs;
    use crate::kernels::launch::{
        alloc, float_dtype, kernel, no_cpu_fwd, ptx, row_config, view, with_dtype, Ptx, NULL,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("attn_softmax");

    /// The warp-a-row kernels' vectors of 8 per lane (1, 2 or 4) for rows of `tk`, when they
    /// apply: Tk ≤ 1024 and a multiple of 8, every input starting 16-byte aligned (`offsets`:
    /// their start offsets in bytes; fresh outputs are aligned).
    fn warp_vectors(tk: usize, offsets: &[usize]) -> Option<u32> {
        let aligned = offsets.iter().all(|o| o.is_multiple_of(16));
        (tk <= 1024 && tk.is_multiple_of(8) && aligned)
            .then(|| tk.div_ceil(256).next_power_of_two() as u32)
    }

    /// Four warps a block, one row a warp.
    fn warp_config(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// softmax(scale·s + bias) (⊙ keep / (1 − p)). Output (1 | 2, B, nh, Tq, Tk): the dropped
    /// probabilities, then (with `with_probs` and dropout) the probabilities before dropout.
    struct AttnSoftmax {
        scale: f32,
        keep: KeepArgs,
        with_probs: bool,
    }

    impl AttnSoftmax {
        fn run(
            &self,
            s: (&CudaStorage, &Layout),
            bias: (&CudaStorage, &Layout),
            mask: Option<(&CudaStorage, &Layout)>,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = s.0.device().clone();
            let (b, nh, tq, tk) = s.1.shape().dims4()?;
            let bh = bias.1.shape().dims4()?.1;
            let rows = b * nh * tq;
            let n = rows * tk;
            let two = self.with_probs && self.keep.active;
            let dt = s.0.dtype();
            let offsets = [
                s.1.start_offset() * dt.size_in_bytes(),
                bias.1.start_offset() * 4,
            ];
            let nv = warp_vectors(tk, &offsets);
            let func = match nv {
                Some(1) => kernel!(dev, PTX, "tb_attn_softmax_fwd_w1", dt)?,
                Some(2) => kernel!(dev, PTX, "tb_attn_softmax_fwd_w2", dt)?,
                Some(_) => kernel!(dev, PTX, "tb_attn_softmax_fwd_w4", dt)?,
                None => kernel!(dev, PTX, "tb_attn_softmax_fwd", dt)?,
            };
            let rows_i = rows as i64;
            with_dtype!(s.0.dtype(), T => {
                let sv = view::<T>(s.0, s.1)?;
                let bv = view::<f32>(bias.0, bias.1)?;
                let out = alloc::<T>(&dev, if two { 2 * n } else { n })?;
                let mv = mask.map(|(k, l)| view::<u8>(k, l)).transpose()?;
                let dims = [nh as i32, bh as i32, tq as i32, tk as i32];
                // Optional pointers (the mask, the probabilities): pushed by hand, not by
                // `launch!`.
                let mut launch = func.builder();
                launch.arg(&sv).arg(&bv);
                match &mv {
                    Some(m) => launch.arg(m),
                    None => launch.arg(&NULL),
                };
                launch.arg(&self.keep.key).arg(&self.keep.thresh);
                let probs = out.slice(n..);
                launch.arg(&out);
                if two {
                    launch.arg(&probs);
                } else {
                    launch.arg(&NULL);
                }
                launch.arg(&self.scale).arg(&self.keep.scale);
                for d in &dims {
                    launch.arg(d);
                }
                let cfg = match nv {
                    Some(_) => {
                        launch.arg(&rows_i);
                        warp_config(rows)
                    }
                    None => row_config(rows, tk),
                };
                // SAFETY: s, the mask and each output hold rows·Tk elements; bias (B, bh, Tq, Tk);
                // the warp kernels' 16-byte loads start at aligned rows (warp_vectors).
                unsafe { launch.launch(cfg) }.w()?;
                let shape: Vec<usize> = [if two { 2 } else { 1 }, b, nh, tq, tk].to_vec();
                Ok((T::wrap_cuda_slice(out, dev), Shape::from(shape)))
            })
        }
    }

    impl CustomOp2 for AttnSoftmax {
        fn name(&self) -> &'static str {
            "tb-attn-softmax"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            sl: &Layout,
            bias: &CudaStorage,
            bl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run((s, sl), (bias, bl), None)
        }
    }

    impl CustomOp3 for AttnSoftmax {
        fn name(&self) -> &'static str {
            "tb-attn-softmax-dropout"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            sl: &Layout,
            bias: &CudaStorage,
            bl: &Layout,
            keep: &CudaStorage,
            kl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run((s, sl), (bias, bl), Some((keep, kl)))
        }
    }

    /// Bias layouts the kernel reads directly: f32, contiguous, (B, 1 | nh, Tq, Tk).
    fn bias_fits(s: &Tensor, bias: &Tensor) -> bool {
        let (Ok((b, nh, tq, tk)), Ok((bb, bh, bq, bk))) = (s.dims4(), bias.dims4()) else {
            return false;
        };
        bias.dtype() == DType::F32
            && bias.is_contiguous()
            && (bb, bq, bk) == (b, tq, tk)
            && (bh == 1 || bh == nh)
    }

    pub fn attn_softmax(
        s: &Tensor,
        bias: &Tensor,
        scale: f64,
        keep: Option<(&Keep, f32)>,
        with_probs: bool,
    ) -> Result<Option<(Tensor, Option<Tensor>)>> {
        if !s.device().is_cuda() || !float_dtype(s) || !bias_fits(s, bias) {
            return Ok(None);
        }
        let s = s.contiguous()?;
        let op = AttnSoftmax {
            scale: scale as f32,
            keep: KeepArgs::new(keep),
            with_probs,
        };
        let out = match keep {
            Some((Keep::Mask(m), _)) => s.apply_op3_no_bwd(bias, &m.contiguous()?, &op)?,
            _ => s.apply_op2_no_bwd(bias, &op)?,
        };
        let dropped = out.get(0)?;
        let probs = match (with_probs, keep) {
            (false, _) => None,
            (true, Some(_)) => Some(out.get(1)?),
            (true, None) => Some(dropped.clone()),
        };
        Ok(Some((dropped, probs)))
    }

    /// ds = scale · p ⊙ (dp − Σ p·dp), dp = dpd ⊙ keep / (1 − p_drop).
    struct AttnSoftmaxBwd {
        scale: f32,
        keep: KeepArgs,
    }

    impl AttnSoftmaxBwd {
        fn run(
            &self,
            p: (&CudaStorage, &Layout),
            dpd: (&CudaStorage, &Layout),
            mask: Option<(&CudaStorage, &Layout)>,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = p.0.device().clone();
            let dims = p.1.shape().dims();
            let tk = *dims.last().unwrap();
            let n = p.1.shape().elem_count();
            let rows = n / tk;
            let dt = p.0.dtype();
            let offsets =
                [p.1.start_offset(), dpd.1.start_offset()].map(|o| o * dt.size_in_bytes());
            let nv = warp_vectors(tk, &offsets);
            let func = match nv {
                Some(1) => kernel!(dev, PTX, "tb_attn_softmax_bwd_w1", dt)?,
                Some(2) => kernel!(dev, PTX, "tb_attn_softmax_bwd_w2", dt)?,
                Some(_) => kernel!(dev, PTX, "tb_attn_softmax_bwd_w4", dt)?,
                None => kernel!(dev, PTX, "tb_attn_softmax_bwd", dt)?,
            };
            let rows_i = rows as i64;
            with_dtype!(p.0.dtype(), T => {
                let (pv, gv) = (view::<T>(p.0, p.1)?, view::<T>(dpd.0, dpd.1)?);
                let mv = mask.map(|(k, l)| view::<u8>(k, l)).transpose()?;
                let out = alloc::<T>(&dev, n)?;
                let tk_i = tk as i32;
                // An optional pointer (the mask): pushed by hand, not by `launch!`.
                let mut launch = func.builder();
                launch.arg(&pv).arg(&gv);
                match &mv {
                    Some(m) => launch.arg(m),
                    None => launch.arg(&NULL),
                };
                launch.arg(&self.keep.key).arg(&self.keep.thresh);
                launch.arg(&out).arg(&self.scale).arg(&self.keep.scale).arg(&tk_i);
                let cfg = match nv {
                    Some(_) => {
                        launch.arg(&rows_i);
                        warp_config(rows)
                    }
                    None => row_config(rows, tk),
                };
                // SAFETY: p, dpd, the mask and out hold rows·Tk elements; the warp kernels'
                // 16-byte loads start at aligned rows (warp_vectors).
                unsafe { launch.launch(cfg) }.w()?;
                Ok((T::wrap_cuda_slice(out, dev), p.1.shape().clone()))
            })
        }
    }

    impl CustomOp2 for AttnSoftmaxBwd {
        fn name(&self) -> &'static str {
            "tb-attn-softmax-bwd"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            p: &CudaStorage,
            pl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run((p, pl), (g, gl), None)
        }
    }

    impl CustomOp3 for AttnSoftmaxBwd {
        fn name(&self) -> &'static str {
            "tb-attn-softmax-bwd-dropout"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            p: &CudaStorage,
            pl: &Layout,
            g: &CudaStorage,
            gl: &Layout,
            k: &CudaStorage,
            kl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run((p, pl), (g, gl), Some((k, kl)))
        }
    }

    pub fn attn_softmax_bwd(
        p: &Tensor,
        dpd: &Tensor,
        scale: f64,
        keep: Option<(&Keep, f32)>,
    ) -> Result<Option<Tensor>> {
        if !p.device().is_cuda() || !float_dtype(p) || dpd.dtype() != p.dtype() {
            return Ok(None);
        }
        let op = AttnSoftmaxBwd {
            scale: scale as f32,
            keep: KeepArgs::new(keep),
        };
        let (p, dpd) = (p.contiguous()?, dpd.contiguous()?);
        Ok(Some(match keep {
            Some((Keep::Mask(m), _)) => p.apply_op3_no_bwd(&dpd, &m.contiguous()?, &op)?,
            _ => p.apply_op2_no_bwd(&dpd, &op)?,
        }))
    }
}
