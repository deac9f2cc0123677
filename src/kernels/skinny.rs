//! Decode projections at 1–16 rows on tensor cores (`--fused skinny`; kernel in skinny.cu):
//! act(x W + b) in one launch that reads W once in 16-byte vectors, for GPT-2's Conv1D weights
//! (in, out) and nn.Linear weights (out, in), the bias optional (the LM head has none).
//! cuBLAS's small-M kernels read these weights at 0.5–1.2 TB/s (docs/perf-notes.md).
//! Shapes: x (M, K), W (K, N) or (N, K), b (N,) -> (M, N); bf16 or f16.

use super::{enabled, Act, Fused};
use candle_core::{Result, Tensor};

/// Rows this kernel takes: the M of one m16n8k16 tensor-core tile.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const MAX_ROWS: usize = 16;

/// act(x W + b) (`w_out_in`: act(x Wᵀ + b)) for at most [`MAX_ROWS`] rows, inference only (no
/// backward); None where it does not apply (CPU, switched off, a tensor tracked by autograd,
/// more rows, fp32, an activation other than none /
/// tanh-GELU, K not a multiple of 32, a Conv1D N not a multiple of 16, operands that are not
/// contiguous from 16-byte boundaries).
pub fn skinny(
    x: &Tensor,
    w: &Tensor,
    w_out_in: bool,
    b: Option<&Tensor>,
    act: Act,
) -> Result<Option<Tensor>> {
    let tracked = x.track_op() || w.track_op() || b.is_some_and(Tensor::track_op);
    if !enabled(Fused::Skinny) || tracked {
        return Ok(None);
    }
    imp::skinny(x, w, w_out_in, b, act)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{Result, Tensor};

    pub fn skinny(
        _: &Tensor,
        _: &Tensor,
        _: bool,
        _: Option<&Tensor>,
        _: Act,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, MAX_ROWS};
    use crate::kernels::launch::{
        aligned16, alloc, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx, NULL,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig};
    use candle_core::{CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("skinny");
    /// Warps a block (skinny.cu's WARPS).
    const WARPS: u32 = 8;
    /// Streaming multiprocessors of an H100 SXM: nn.Linear outputs with fewer than this many
    /// 16-column tiles take 8-column tiles (more blocks, each reading x again).
    const SMS: usize = 132;

    struct Skinny {
        w_out_in: bool,
        act: Act,
    }

    impl Skinny {
        /// Launches on x (M, K), W, and the bias pointer (0: none); returns y (M, N).
        fn run(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
            b: Option<(&CudaStorage, &Layout)>,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (m, k) = xl.shape().dims2()?;
            let n = if self.w_out_in {
                wl.shape().dims2()?.0
            } else {
                wl.shape().dims2()?.1
            };
            let (func, cols) = if !self.w_out_in {
                (kernel!(dev, PTX, "tb_skinny_conv1d", x.dtype())?, 16)
            } else if n / 16 >= SMS {
                (kernel!(dev, PTX, "tb_skinny_linear2", x.dtype())?, 16)
            } else {
                (kernel!(dev, PTX, "tb_skinny_linear1", x.dtype())?, 8)
            };
            let (m_i, n_i, k_i, act) = (m as i32, n as i32, k as i32, self.act.code());
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(cols) as u32, 1, 1),
                block_dim: (32 * WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            with_dtype!(x.dtype(), T => {
                let (xv, wv) = (view::<T>(x, xl)?, view::<T>(w, wl)?);
                let stream = dev.cuda_stream();
                // The kernel reads no bias through a null pointer.
                let bias: u64 = match b {
                    Some((s, l)) => view::<T>(s, l)?.device_ptr(&stream).0,
                    None => NULL,
                };
                let out = alloc::<T>(&dev, m * n)?;
                // SAFETY: x holds m·k and W n·k elements, contiguous from 16-byte boundaries,
                // k a multiple of 32 and (Conv1D) n of 16, the bias n or none (checked by
                // skinny); out holds m·n.
                launch!(unsafe func, cfg; &xv, &wv, &bias, &out, &m_i, &n_i, &k_i, &act)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
            })
        }
    }

    /// With a bias.
    impl CustomOp3 for Skinny {
        fn name(&self) -> &'static str {
            "tb-skinny"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
            b: &CudaStorage,
            bl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run(x, xl, w, wl, Some((b, bl)))
        }
    }

    /// Without one.
    impl CustomOp2 for Skinny {
        fn name(&self) -> &'static str {
            "tb-skinny"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run(x, xl, w, wl, None)
        }
    }

    pub fn skinny(
        x: &Tensor,
        w: &Tensor,
        w_out_in: bool,
        b: Option<&Tensor>,
        act: Act,
    ) -> Result<Option<Tensor>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let fits = matches!(act, Act::None | Act::GeluTanh) && x.rank() == 2 && w.rank() == 2;
        if !x.device().is_cuda() || !half || !fits || x.dim(0)? > MAX_ROWS {
            return Ok(None);
        }
        let k = x.dim(1)?;
        let (wk, n) = if w_out_in {
            (w.dim(1)?, w.dim(0)?)
        } else {
            w.dims2()?
        };
        let tiles = k.is_multiple_of(32) && (w_out_in || n.is_multiple_of(16));
        let bias_fits =
            b.is_none_or(|b| b.dtype() == x.dtype() && b.dims() == [n] && b.is_contiguous());
        let laid = x.is_contiguous() && w.is_contiguous() && aligned16(x) && aligned16(w);
        if wk != k || !tiles || w.dtype() != x.dtype() || !bias_fits || !laid {
            return Ok(None);
        }
        let op = Skinny { w_out_in, act };
        Ok(Some(match b {
            Some(b) => x.apply_op3_no_bwd(w, b, &op)?,
            None => x.apply_op2_no_bwd(w, &op)?,
        }))
    }
}
