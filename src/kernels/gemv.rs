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
    imp::gemv(x, w, Some(b), act)
}

/// Bytes of W's row from which the LM head takes the GEMV: four 16-byte vectors a lane of a
/// one-row block. bloom-560m's 2 KB rows (one vector a lane, 250880 blocks) made its step
/// 0.18 ms slower than cuBLAS's head; bloom-7b1's 8 KB rows 25 µs faster (results/h200x2/ew-run1).
const HEAD_MIN_ROW_BYTES: usize = 8192;

/// x Wᵀ for an LM head W (V, C) at 1–4 rows (`--fused gemv-head`); None where [`gemv`] would
/// not apply, the path is off or W's rows are shorter than [`HEAD_MIN_ROW_BYTES`].
pub fn gemv_head(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let tracked = x.track_op() || w.track_op(); // no backward
    let short = w.dim(1)? * w.dtype().size_in_bytes() < HEAD_MIN_ROW_BYTES;
    if !enabled(Fused::Gemv) || !enabled(Fused::GemvHead) || tracked || short {
        return Ok(None);
    }
    imp::gemv(x, w, None, Act::None)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{Result, Tensor};

    pub fn gemv(_: &Tensor, _: &Tensor, _: Option<&Tensor>, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, MAX_ROWS};
    use crate::kernels::launch::{
        aligned16, alloc, launch, no_cpu_fwd, ptx, suffix, view, with_dtype, Ptx, NULL,
    };
    use crate::kernels::pdl::Early;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("gemv");

    /// Output columns a block computes (gemv.cuh's COLS; gemv.cu takes one for one row), and
    /// warps a column (its SPLIT).
    const COLS_PER_BLOCK: usize = 2;
    const WARPS_PER_COL: u32 = 4;

    /// act(x Wᵀ + b); [`GemvNoBias`] x Wᵀ.
    struct Gemv {
        act: Act,
    }
    struct GemvNoBias;

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
            run(x, xl, w, wl, Some((b, bl)), self.act)
        }
    }

    impl CustomOp2 for GemvNoBias {
        fn name(&self) -> &'static str {
            "tb-gemv-no-bias"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            run(x, xl, w, wl, None, Act::None)
        }
    }

    fn run(
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
        b: Option<(&CudaStorage, &Layout)>,
        act: Act,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device().clone();
        let (m, k) = xl.shape().dims2()?;
        let n = wl.shape().dims2()?.0;
        let name = format!("tb_gemv{}_{}", m.min(MAX_ROWS), suffix(x.dtype())?);
        let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
        let kv = (k * x.dtype().size_in_bytes() / 16) as i32;
        let (n_i, act) = (n as i32, act.code());
        let cols = if m == 1 { 1 } else { COLS_PER_BLOCK };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(cols) as u32, 1, 1),
            block_dim: (32 * WARPS_PER_COL * cols as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        with_dtype!(x.dtype(), T => {
            let (xv, wv) = (view::<T>(x, xl)?, view::<T>(w, wl)?);
            let bv = b.map(|(b, bl)| view::<T>(b, bl)).transpose()?;
            let early = Early::begin(&dev, m)?;
            let out = alloc::<T>(&dev, m * n)?;
            early.launch()?;
            // SAFETY: x holds m·k, W n·k and b (where given) n elements, contiguous from
            // 16-byte boundaries in whole vectors (checked by gemv); out holds m·n; a null b
            // is read as no bias.
            match &bv {
                Some(bv) => launch!(unsafe func, cfg; &xv, &wv, bv, &out, &n_i, &kv, &act)?,
                None => launch!(unsafe func, cfg; &xv, &wv, &NULL, &out, &n_i, &kv, &act)?,
            };
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
        })
    }

    pub fn gemv(x: &Tensor, w: &Tensor, b: Option<&Tensor>, act: Act) -> Result<Option<Tensor>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let fits = matches!(act, Act::None | Act::GeluTanh) && x.rank() == 2 && w.rank() == 2;
        if !x.device().is_cuda() || !half || !fits || x.dim(0)? > MAX_ROWS {
            return Ok(None);
        }
        let (k, (n, wk)) = (x.dim(1)?, w.dims2()?);
        let whole = (k * x.dtype().size_in_bytes()).is_multiple_of(16);
        let bias_fits =
            b.is_none_or(|b| b.dtype() == x.dtype() && b.dims() == [n] && b.is_contiguous());
        let same = w.dtype() == x.dtype() && bias_fits;
        let laid = x.is_contiguous() && w.is_contiguous();
        if wk != k || !whole || !same || !laid || !aligned16(x) || !aligned16(w) {
            return Ok(None);
        }
        Ok(Some(match b {
            Some(b) => x.apply_op3_no_bwd(w, b, &Gemv { act })?,
            None => x.apply_op2_no_bwd(w, &GemvNoBias)?,
        }))
    }
}
