//! Decode projections at 1–4 rows for nn.Linear weights (`--fused gemv`; kernel in gemv.cu):
//! act(x Wᵀ + b) in one launch, four warps an output column reading W's row once. cuBLAS's small-M
//! kernels read BLOOM's decode weights well under the copy bandwidth (docs/perf-notes.md).
//! Shapes: x (M, K), W (N, K), b (N,) -> (M, N); bf16 or f16.

use super::{enabled, Act, Fused};
use candle_core::{Result, Tensor};

/// A LayerNorm's weight, bias and epsilon.
pub type NormParams<'a> = (&'a Tensor, &'a Tensor, f64);

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

/// (act(norm(x + r) Wᵀ + b), x + r) for one row (`--fused norm-gemv`): the residual add and
/// the LayerNorm before a projection inside its GEMV, each block normalising the row itself.
/// x, r (1, K); W (out, K); b (out,). None where it does not apply (as [`gemv`], and more than
/// one row, K over 4096 halves).
pub fn gemv_norm(
    x: &Tensor,
    r: &Tensor,
    norm: NormParams,
    w: &Tensor,
    b: &Tensor,
    act: Act,
) -> Result<Option<(Tensor, Tensor)>> {
    if !enabled(Fused::Gemv) || !enabled(Fused::NormGemv) {
        return Ok(None);
    }
    let out = imp::gemv_norm(x, r, norm, w, b, act)?;
    if out.is_some() {
        NORM_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(out)
}

static NORM_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`gemv_norm`]'s launches in this process (the tests check that a path took it).
pub fn gemv_norm_launches() -> usize {
    NORM_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{Act, NormParams};
    use candle_core::{Result, Tensor};

    pub fn gemv(_: &Tensor, _: &Tensor, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn gemv_norm(
        _: &Tensor,
        _: &Tensor,
        _: NormParams,
        _: &Tensor,
        _: &Tensor,
        _: Act,
    ) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, NormParams, MAX_ROWS};
    use crate::kernels::launch::{
        aligned16, alloc, cuda, kernel, launch, no_cpu_fwd, ptx, storage, view, with_dtype, wrap,
        Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("gemv");

    /// Output columns a block computes, and warps a column (gemv.cu's COLS and SPLIT).
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
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(COLS_PER_BLOCK) as u32, 1, 1),
                block_dim: (32 * WARPS_PER_COL * COLS_PER_BLOCK as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            with_dtype!(x.dtype(), T => {
                let (xv, wv, bv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(b, bl)?);
                let out = alloc::<T>(&dev, m * n)?;
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

    /// 16-byte vectors of the row a lane of [`gemv_norm`]'s column holds (gemv.cu's NV), and
    /// the blocks a multiprocessor keeps of it (its `__launch_bounds__`).
    const NORM_ROW_VECTORS: usize = 4;

    pub fn gemv_norm(
        x: &Tensor,
        r: &Tensor,
        (lw, lb, eps): NormParams,
        w: &Tensor,
        b: &Tensor,
        act: Act,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let fits = matches!(act, Act::None | Act::GeluTanh) && x.rank() == 2 && w.rank() == 2;
        if !x.device().is_cuda() || !half || !fits || x.dim(0)? != 1 {
            return Ok(None);
        }
        let (k, (n, wk)) = (x.dim(1)?, w.dims2()?);
        let kv = k * x.dtype().size_in_bytes() / 16;
        let whole = (k * x.dtype().size_in_bytes()).is_multiple_of(16);
        let held = kv <= 32 * WARPS_PER_COL as usize * NORM_ROW_VECTORS;
        let same = [r, lw, lb, w, b].iter().all(|t| t.dtype() == x.dtype());
        let shapes =
            r.dims() == x.dims() && lw.dims() == [k] && lb.dims() == [k] && b.dims() == [n];
        let laid = [x, r, lw, lb, w, b].into_iter().all(aligned16);
        if wk != k || !whole || !held || !same || !shapes || !laid {
            return Ok(None);
        }
        let guards = [x, r, lw, lb, w, b]
            .into_iter()
            .map(cuda)
            .collect::<Option<Vec<_>>>();
        let Some(g) = guards else {
            return Ok(None);
        };
        let dev = storage(&g[0].0).device().clone();
        let func = kernel!(dev, PTX, "tb_gemv_norm", x.dtype())?;
        let (n_i, kv_i, eps, act) = (n as i32, kv as i32, eps as f32, act.code());
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(COLS_PER_BLOCK) as u32, 1, 1),
            block_dim: (32 * WARPS_PER_COL * COLS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let out = with_dtype!(x.dtype(), T => {
            let v = |i: usize| view::<T>(storage(&g[i].0), g[i].1);
            let (xv, rv, lwv, lbv, wv, bv) = (v(0)?, v(1)?, v(2)?, v(3)?, v(4)?, v(5)?);
            let (y, s) = (alloc::<T>(&dev, n)?, alloc::<T>(&dev, k)?);
            // SAFETY: x, r, s and the norm's weight and bias hold K elements, W n·K and b n, all
            // contiguous from 16-byte boundaries in whole vectors, at most NORM_ROW_VECTORS a
            // lane of a column (checked above); y holds n.
            launch!(unsafe func, cfg; &xv, &rv, &lwv, &lbv, &eps, &wv, &bv, &y, &s, &n_i, &kv_i, &act)?;
            (wrap(y, &dev, (1, n)), wrap(s, &dev, (1, k)))
        });
        Ok(Some(out))
    }
}
