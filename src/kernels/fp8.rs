//! fp8 weights (`--dtype fp8`; kernels in fp8.cu): E4M3 values with one f32 scale per output
//! row, read by a decode GEMV at 1–4 rows (half the bf16 GEMV's bytes; 5–16 rows: the
//! tensor-core kernel, [`super::skinny_fp8`]) and turned back into the activations' dtype for
//! the rows neither takes. The quantization itself is candle's ops
//! ([`crate::models::fp8`]), so the CPU has the same weights.
//! Shapes: q (N, K) F8E4M3, K a multiple of 16; sb (N, 2) f32: each row's scale and bias;
//! x (M, K) -> (M, N).

use super::{enabled, Act, Fused};
use candle_core::{DType, Result, Tensor};

/// Rows the fp8 GEMV takes.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const FP8_GEMV_MAX_ROWS: usize = 4;

/// act(scale · (x qᵀ) + bias), sb holding (scale, bias) a row, for at most
/// [`FP8_GEMV_MAX_ROWS`] rows of bf16 / f16 x; None where it does not apply (CPU, `--fused`
/// without gemv, more rows, an activation other than none / tanh-GELU, unaligned operands).
pub fn gemv_fp8(x: &Tensor, q: &Tensor, sb: &Tensor, act: Act) -> Result<Option<Tensor>> {
    if !enabled(Fused::Gemv) {
        return Ok(None);
    }
    imp::gemv_fp8(x, q, sb, act)
}

/// w (N, K) as (q (N, K) F8E4M3, scale (N, 1) f32), each row scaled to E4M3's 448 and rounded
/// to nearest even (the CPU's float8 crate's rounding); None on the CPU (candle's ops there).
pub fn quantize_fp8(w: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    imp::quantize_fp8(w)
}

/// scale · q as (N, K) in `dtype`; None on the CPU (candle's cast and multiply there).
pub fn dequant_fp8(q: &Tensor, sb: &Tensor, dtype: DType) -> Result<Option<Tensor>> {
    imp::dequant_fp8(q, sb, dtype)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{DType, Result, Tensor};

    pub fn gemv_fp8(_: &Tensor, _: &Tensor, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn dequant_fp8(_: &Tensor, _: &Tensor, _: DType) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn quantize_fp8(_: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, FP8_GEMV_MAX_ROWS};
    use crate::kernels::launch::{
        aligned16, alloc, cuda, flat_config, kernel, launch, no_cpu_fwd, ptx, row_config, storage,
        suffix, view, with_dtype, wrap, Ptx,
    };
    use crate::kernels::pdl::Early;
    use crate::kernels::{enabled, Fused};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
    use float8::F8E4M3;

    const PTX: Ptx = ptx!("fp8");

    /// Output columns a block computes (fp8.cu's COLS), and warps over K (its SPLIT): four, or
    /// eight for one row whose K gives every lane of eight a 16-byte vector a column.
    const COLS_PER_BLOCK: usize = 4;
    const WARPS_PER_BLOCK: u32 = 4;
    const WARPS_ONE_LONG_ROW: u32 = 8;

    struct GemvFp8 {
        act: Act,
    }

    impl CustomOp3 for GemvFp8 {
        fn name(&self) -> &'static str {
            "tb-gemv-fp8"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            q: &CudaStorage,
            ql: &Layout,
            sb: &CudaStorage,
            sbl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let m = xl.shape().dims2()?.0;
            let (n, k) = ql.shape().dims2()?;
            let long_row = m == 1 && k / 16 >= 32 * WARPS_ONE_LONG_ROW as usize;
            let (name, warps) = match m {
                _ if long_row => ("1w8", WARPS_ONE_LONG_ROW),
                1 => ("1", WARPS_PER_BLOCK),
                2 => ("2", WARPS_PER_BLOCK),
                3 => ("3", WARPS_PER_BLOCK),
                _ => ("4", WARPS_PER_BLOCK),
            };
            // tb_early_gemv_fp8_* load their first weight vectors before the wait.
            let early = if enabled(Fused::EarlyWeights) {
                "early_"
            } else {
                ""
            };
            let name = format!("tb_{early}gemv_fp8_{name}_{}", suffix(x.dtype())?);
            let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
            let (n_i, kq, act) = (n as i32, (k / 16) as i32, self.act.code());
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(COLS_PER_BLOCK) as u32, 1, 1),
                block_dim: (32 * warps, 1, 1),
                shared_mem_bytes: 0,
            };
            let (qv, sbv) = (view::<F8E4M3>(q, ql)?, view::<f32>(sb, sbl)?);
            with_dtype!(x.dtype(), T => {
                let xv = view::<T>(x, xl)?;
                let early = Early::begin(&dev, m)?;
                let out = alloc::<T>(&dev, m * n)?;
                early.launch()?;
                // SAFETY: x holds m·k, q n·k and sb 2n elements, contiguous from 16-byte
                // boundaries, k a multiple of 16 (checked by gemv_fp8); out holds m·n.
                launch!(unsafe func, cfg; &xv, &qv, &sbv, &out, &n_i, &kq, &act)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
            })
        }
    }

    pub fn gemv_fp8(x: &Tensor, q: &Tensor, sb: &Tensor, act: Act) -> Result<Option<Tensor>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let fits = matches!(act, Act::None | Act::GeluTanh) && x.rank() == 2 && q.rank() == 2;
        if !x.device().is_cuda() || !half || !fits || x.dim(0)? > FP8_GEMV_MAX_ROWS {
            return Ok(None);
        }
        let (k, (n, qk)) = (x.dim(1)?, q.dims2()?);
        let laid = x.is_contiguous() && aligned16(q) && sb.is_contiguous() && aligned16(x);
        let typed = q.dtype() == DType::F8E4M3 && sb.dtype() == DType::F32 && sb.dims() == [n, 2];
        if qk != k || !k.is_multiple_of(16) || !laid || !typed {
            return Ok(None);
        }
        Ok(Some(x.apply_op3_no_bwd(q, sb, &GemvFp8 { act })?))
    }

    struct Dequant {
        dtype: DType,
    }

    impl CustomOp2 for Dequant {
        fn name(&self) -> &'static str {
            "tb-fp8-dequant"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            q: &CudaStorage,
            ql: &Layout,
            sb: &CudaStorage,
            sbl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = q.device().clone();
            let (n, k) = ql.shape().dims2()?;
            let func = kernel!(dev, PTX, "tb_fp8_dequant", self.dtype)?;
            let (kq, vectors) = ((k / 16) as i32, (n * k / 16) as i64);
            let (qv, sbv) = (view::<F8E4M3>(q, ql)?, view::<f32>(sb, sbl)?);
            with_dtype!(self.dtype, T => {
                let out = alloc::<T>(&dev, n * k)?;
                // SAFETY: q holds n·k and sb 2n elements, q from a 16-byte boundary, k a
                // multiple of 16 (checked by dequant_fp8); out holds n·k.
                launch!(unsafe func, flat_config(n * k / 16); &qv, &sbv, &out, &kq, &vectors)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((n, k))))
            })
        }
    }

    pub fn dequant_fp8(q: &Tensor, sb: &Tensor, dtype: DType) -> Result<Option<Tensor>> {
        let float = matches!(dtype, DType::F32 | DType::BF16 | DType::F16);
        if !q.device().is_cuda() || !float || q.dtype() != DType::F8E4M3 || q.rank() != 2 {
            return Ok(None);
        }
        let (n, k) = q.dims2()?;
        if !k.is_multiple_of(16) || !aligned16(q) || !sb.is_contiguous() || sb.dims() != [n, 2] {
            return Ok(None);
        }
        Ok(Some(q.apply_op2_no_bwd(sb, &Dequant { dtype })?))
    }

    pub fn quantize_fp8(w: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
        let float = matches!(w.dtype(), DType::F32 | DType::BF16 | DType::F16);
        if !float || w.rank() != 2 || !w.is_contiguous() {
            return Ok(None);
        }
        let Some((ws, wl)) = cuda(w) else {
            return Ok(None);
        };
        let (n, k) = w.dims2()?;
        let s = storage(&ws);
        let dev = s.device().clone();
        let func = kernel!(dev, PTX, "tb_fp8_quantize", w.dtype())?;
        let k_i = k as i32;
        let q = alloc::<F8E4M3>(&dev, n * k)?;
        let scale = alloc::<f32>(&dev, n)?;
        with_dtype!(w.dtype(), T => {
            let wv = view::<T>(s, wl)?;
            // SAFETY: w holds n·k contiguous elements; q n·k, scale n.
            launch!(unsafe func, row_config(n, k); &wv, &q, &scale, &k_i)?;
        });
        Ok(Some((wrap(q, &dev, (n, k)), wrap(scale, &dev, (n, 1)))))
    }
}
