//! Decode projections at 1–4 rows for nn.Linear weights (`--fused gemv`; kernel in gemv.cu):
//! act(x Wᵀ + b) in one launch, four warps an output column reading W's row once. cuBLAS's small-M
//! kernels read BLOOM's decode weights well under the copy bandwidth (docs/perf-notes.md).
//! Shapes: x (M, K), W (N, K), b (N,) -> (M, N); bf16 or f16.

use super::{enabled, Act, Fused};
use candle_core::{Result, Tensor};

/// Rows this kernel takes (one dot product of W's row per row of x).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const MAX_ROWS: usize = 4;

/// act(x Wᵀ + b) for W (out, in) and at most [`MAX_ROWS`] rows; None where it does not apply
/// (CPU, switched off, more rows, fp32, an activation other than none / tanh-GELU, operands
/// that are not contiguous from 16-byte boundaries in whole vectors).
pub fn gemv(x: &Tensor, w: &Tensor, b: &Tensor, act: Act) -> Result<Option<Tensor>> {
    if !enabled(Fused::Gemv) {
        return Ok(None);
    }
    imp::gemv(x, w, b, act)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{Result, Tensor};

    pub fn gemv(_: &Tensor, _: &Tensor, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, MAX_ROWS};
    use crate::kernels::launch::{
        aligned16, alloc, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx,
    };
    use crate::kernels::pdl::Early;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("gemv");

    /// Output columns a block computes (gemv.cuh's COLS; gemv.cu takes one for one row), and
    /// warps a column (its SPLIT).
    const COLS_PER_BLOCK: usize = 2;
    const WARPS_PER_COL: u32 = 4;

    struct Gemv {
        act: Act,
    }

    impl CustomOp3 for Gemv {
        fn name(&self) -> &'static str {
            "tb-gemv"
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
            let dev = x.device().clone();
            let (m, k) = xl.shape().dims2()?;
            let n = wl.shape().dims2()?.0;
            let func = match m {
                1 => kernel!(dev, PTX, "tb_gemv1", x.dtype())?,
                2 => kernel!(dev, PTX, "tb_gemv2", x.dtype())?,
                3 => kernel!(dev, PTX, "tb_gemv3", x.dtype())?,
                _ => kernel!(dev, PTX, "tb_gemv4", x.dtype())?,
            };
            let kv = (k * x.dtype().size_in_bytes() / 16) as i32;
            let (n_i, act) = (n as i32, self.act.code());
            let cols = if m == 1 { 1 } else { COLS_PER_BLOCK };
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(cols) as u32, 1, 1),
                block_dim: (32 * WARPS_PER_COL * cols as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            with_dtype!(x.dtype(), T => {
                let (xv, wv, bv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(b, bl)?);
                let early = Early::begin(&dev, m)?;
                let out = alloc::<T>(&dev, m * n)?;
                early.launch()?;
                // SAFETY: x holds m·k, W n·k and b n elements, contiguous from 16-byte
                // boundaries in whole vectors (checked by gemv); out holds m·n.
                launch!(unsafe func, cfg; &xv, &wv, &bv, &out, &n_i, &kv, &act)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
            })
        }
    }

    pub fn gemv(x: &Tensor, w: &Tensor, b: &Tensor, act: Act) -> Result<Option<Tensor>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let fits = matches!(act, Act::None | Act::GeluTanh) && x.rank() == 2 && w.rank() == 2;
        if !x.device().is_cuda() || !half || !fits || x.dim(0)? > MAX_ROWS {
            return Ok(None);
        }
        let (k, (n, wk)) = (x.dim(1)?, w.dims2()?);
        let whole = (k * x.dtype().size_in_bytes()).is_multiple_of(16);
        let same = w.dtype() == x.dtype() && b.dtype() == x.dtype() && b.dims() == [n];
        let laid = x.is_contiguous() && w.is_contiguous() && b.is_contiguous();
        if wk != k || !whole || !same || !laid || !aligned16(x) || !aligned16(w) {
            return Ok(None);
        }
        Ok(Some(x.apply_op3_no_bwd(w, b, &Gemv { act })?))
    }
}
