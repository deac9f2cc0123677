//! A decode step's LM head at 1–16 rows on tensor cores (`--fused skinny`; kernel in
//! skinny.cu): logits = x Wᵀ in one launch that reads W (V, C) once in 16-byte vectors. For a
//! vocabulary that is no multiple of 8 (GPT-2's 50257) cuBLAS falls back to a kernel reading the
//! head at 0.8 TB/s (docs/perf-notes.md); elsewhere cuBLAS is faster and keeps it.
//! Shapes: x (M, C), W (V, C) -> (M, V); bf16 or f16.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// Rows this kernel takes: the M of one m16n8k16 tensor-core tile.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const MAX_ROWS: usize = 16;

/// x Wᵀ for W (V, C) and at most [`MAX_ROWS`] rows, inference only (no backward); None where it
/// does not apply (CPU, switched off, a tensor tracked by autograd, more rows, fp32, C not a
/// multiple of 32, operands that are not contiguous from 16-byte boundaries).
pub fn skinny(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Skinny) || x.track_op() || w.track_op() {
        return Ok(None);
    }
    imp::skinny(x, w)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn skinny(_: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::MAX_ROWS;
    use crate::kernels::launch::{
        aligned16, alloc, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("skinny");
    /// Warps a block and output columns a block (skinny.cu's WARPS and COLS).
    const WARPS: u32 = 8;
    const COLS: usize = 16;

    struct Skinny;

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
            let dev = x.device().clone();
            let (m, k) = xl.shape().dims2()?;
            let n = wl.shape().dims2()?.0;
            let func = kernel!(dev, PTX, "tb_skinny", x.dtype())?;
            let (m_i, n_i, k_i) = (m as i32, n as i32, k as i32);
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(COLS) as u32, 1, 1),
                block_dim: (32 * WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            with_dtype!(x.dtype(), T => {
                let (xv, wv) = (view::<T>(x, xl)?, view::<T>(w, wl)?);
                let out = alloc::<T>(&dev, m * n)?;
                // SAFETY: x holds m·k and W n·k elements, contiguous from 16-byte boundaries,
                // k a multiple of 32 (checked by skinny); out holds m·n.
                launch!(unsafe func, cfg; &xv, &wv, &out, &m_i, &n_i, &k_i)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
            })
        }
    }

    pub fn skinny(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let ranks = x.rank() == 2 && w.rank() == 2;
        if !x.device().is_cuda() || !half || !ranks || x.dim(0)? > MAX_ROWS {
            return Ok(None);
        }
        let k = x.dim(1)?;
        let laid = x.is_contiguous() && w.is_contiguous() && aligned16(x) && aligned16(w);
        if w.dim(1)? != k || !k.is_multiple_of(32) || w.dtype() != x.dtype() || !laid {
            return Ok(None);
        }
        Ok(Some(x.apply_op2_no_bwd(w, &Skinny)?))
    }
}
