//! Decode steps' products at 1–16 rows on tensor cores (kernel in skinny.cu): act(x Wᵀ + b) in
//! one launch that reads W (N, K) once in 16-byte vectors. The LM head where the vocabulary is
//! no multiple of 8 (`--fused skinny`: GPT-2's 50257, where cuBLAS falls back to a kernel
//! reading the head at 0.8 TB/s); the projections at 5–16 rows (1–4 where the GEMV is off)
//! with bf16 / f16 weights of at most [`MAX_WEIGHT`] elements, and fp8 projections and heads
//! of any size (`--fused skinny-proj`: cuBLASLt's small-M kernels, or an fp8 weight turned back
//! into bf16 every step, otherwise).
//! Shapes: x (M, K), W (N, K) -> (M, N); bf16 or f16 x.

use super::{enabled, Act, Fused};
use candle_core::{Result, Tensor};

/// Rows this kernel takes: the M of one m16n8k16 tensor-core tile.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const MAX_ROWS: usize = 16;

/// The largest bf16 / f16 projection weight (N·K elements: 4 Mi, 8 MiB) the kernel takes, the
/// largest of a model whose step got faster (bloom-560m's 4096 × 1024; GPT-2's are smaller);
/// bloom-7b1's (4096 × 4096 and up) made its step slower at every shape and tiling swept, 6.40
/// → 6.60–8.08 ms (results/h100x2/skinny-run4, skinny-run5). Larger weights, never timed on
/// the kernel (bloom-7b1's tp-2 attention-output shard, 4096 × 2048; gpt2-large's QKV and MLP
/// weights), stay cuBLASLt's.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const MAX_WEIGHT: usize = 4 << 20;

/// x Wᵀ for an LM head W (V, C) and at most [`MAX_ROWS`] rows, inference only (no backward);
/// None where it does not apply (CPU, `skinny` off, a tensor tracked by autograd, more rows,
/// fp32, C not a multiple of 32, operands that are not contiguous from 16-byte boundaries).
pub fn skinny(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Skinny) || x.track_op() || w.track_op() {
        return Ok(None);
    }
    imp::skinny(x, w, None, Act::None)
}

/// act(x Wᵀ + b) for a projection W (out, in) at most [`MAX_ROWS`] rows, inference only; None
/// where it does not apply (CPU, `skinny-proj` off, a tensor tracked by autograd, more rows,
/// fp32, K not a multiple of 32, operands that are not contiguous from 16-byte boundaries, a
/// weight of more than [`MAX_WEIGHT`] elements, an activation other than none / tanh-GELU).
pub fn skinny_linear(x: &Tensor, w: &Tensor, b: &Tensor, act: Act) -> Result<Option<Tensor>> {
    let tracked = x.track_op() || w.track_op() || b.track_op();
    if !enabled(Fused::SkinnyProj) || tracked || !matches!(act, Act::None | Act::GeluTanh) {
        return Ok(None);
    }
    imp::skinny(x, w, Some(b), act)
}

/// act(scale · x qᵀ + bias) for fp8 weights q (N, K) E4M3 of any size with `sb` (N, 2) f32
/// (each row's scale and bias, [`super::quantize_fp8`]'s) at most [`MAX_ROWS`] rows of bf16 /
/// f16 x, inference only (fp8 weights are); None where it does not apply (CPU, `skinny-proj`
/// off, more rows, an activation other than none / tanh-GELU, K not a multiple of 64,
/// operands that are not contiguous from 16-byte boundaries).
pub fn skinny_fp8(x: &Tensor, q: &Tensor, sb: &Tensor, act: Act) -> Result<Option<Tensor>> {
    if !enabled(Fused::SkinnyProj) || !matches!(act, Act::None | Act::GeluTanh) {
        return Ok(None);
    }
    imp::skinny_fp8(x, q, sb, act)
}

/// x Wᵀ + b + r for a projection W (out, in) at most [`MAX_ROWS`] rows, r (M, out) like the
/// output, the sum rounded as the add kernel rounds it (`--fused skinny-fold`: a branch's last
/// projection with the residual add in its epilogue); None where [`skinny_linear`] would not
/// apply, the path is off or r is not x's dtype and the output's shape.
pub fn skinny_add(x: &Tensor, w: &Tensor, b: &Tensor, r: &Tensor) -> Result<Option<Tensor>> {
    if !folds() || x.track_op() || w.track_op() || b.track_op() || r.track_op() {
        return Ok(None);
    }
    imp::skinny_tail(x, w, Tail::Add { b, r }, Act::None)
}

/// act(LN(x) Wᵀ + b) for x (M, in) the residual stream before its LayerNorm, whose weight and
/// bias [`crate::models::norm_fold`] folded into W and b: sb (out, 2) f32 holds each column's
/// Σₖ W[n, k] and the folded bias; the norm's statistics from the x the products load
/// (`--fused skinny-fold`). None where [`skinny_linear`] would not apply, the path is off or
/// sb is not (out, 2) f32.
pub fn skinny_ln(
    x: &Tensor,
    w: &Tensor,
    sb: &Tensor,
    act: Act,
    eps: f64,
) -> Result<Option<Tensor>> {
    let tracked = x.track_op() || w.track_op();
    if !folds() || tracked || !matches!(act, Act::None | Act::GeluTanh) {
        return Ok(None);
    }
    imp::skinny_tail(x, w, Tail::Norm { sb, eps }, act)
}

/// Whether the folded projections' paths are on.
fn folds() -> bool {
    [Fused::SkinnyProj, Fused::SkinnyFold, Fused::NormFold]
        .into_iter()
        .all(enabled)
}

/// Launches of [`skinny_ln`]'s kernel in this process (a GPU test checks that decoding takes it).
#[cfg(test)]
pub static LN_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Launches of [`skinny_add`]'s (likewise).
#[cfg(test)]
pub static ADD_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Launches of the LM head's kernel ([`skinny`]) in this process (a GPU test checks which
/// heads take it).
#[cfg(test)]
pub static HEAD_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`skinny_add`]'s and [`skinny_ln`]'s operands after W.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum Tail<'a> {
    /// The bias (N,) and the residual (M, N).
    Add { b: &'a Tensor, r: &'a Tensor },
    /// The folded projection's (Σ W, bias), (N, 2) f32, and the norm's epsilon.
    Norm { sb: &'a Tensor, eps: f64 },
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{Act, Tail};
    use candle_core::{Result, Tensor};

    pub fn skinny_tail(_: &Tensor, _: &Tensor, _: Tail<'_>, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn skinny(_: &Tensor, _: &Tensor, _: Option<&Tensor>, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn skinny_fp8(_: &Tensor, _: &Tensor, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, Tail, MAX_ROWS, MAX_WEIGHT};
    use crate::kernels::launch::{
        aligned16, alloc, cuda, device_address, kernel, launch, no_cpu_fwd, ptx, storage, suffix,
        view, with_dtype, wrap, Ptx,
    };
    use crate::kernels::pdl::Early;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};
    use float8::F8E4M3;

    const PTX: Ptx = ptx!("skinny");

    /// Warps a block (skinny.cu's WARPS).
    const WARPS: u32 = 8;

    /// 8-column tiles a projection's block: from 2304 columns of 16-bit weights two (the qkv
    /// and the MLP's first projection of gpt2 and BLOOM: 144–256 blocks; with x in 16-byte
    /// loads four were 6–21 µs a step slower, results/h100/knob-run73, though with 4-byte ones
    /// they had beaten one by 12–16 µs, nt-run64), from 4096 of E4M3 four (the widths fp8 was
    /// timed at), else one (a 1024-wide output over 128 blocks). skinny.cu has these only.
    fn tiles(n: usize, fp8: bool) -> usize {
        match (fp8, n) {
            (false, 2304..) => 2,
            (true, 4096..) => 4,
            _ => 1,
        }
    }

    /// The 16-bit projection kernel of `nt` tiles ([`tiles`]), plain (`kind` "") or with the
    /// norm folded ("_ln"), for `dtype`: one name for every launcher, so that a tile count
    /// skinny.cu lacks fails to load rather than running another count's kernel on its grid.
    fn projection_kernel_name(kind: &str, nt: usize, dtype: DType) -> Result<String> {
        Ok(format!("tb_skinny{kind}{nt}_{}", suffix(dtype)?))
    }

    fn config(n: usize, nt: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n.div_ceil(8 * nt) as u32, 1, 1),
            block_dim: (32 * WARPS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A projection's launch: act(x Wᵀ + b).
    fn linear(
        x: (&CudaStorage, &Layout),
        w: (&CudaStorage, &Layout),
        b: (&CudaStorage, &Layout),
        act: Act,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.0.device().clone();
        let (m, k) = x.1.shape().dims2()?;
        let n = w.1.shape().dims2()?.0;
        let nt = tiles(n, false);
        let name = projection_kernel_name("", nt, x.0.dtype())?;
        let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
        let (m_i, n_i, k_i, act) = (m as i32, n as i32, k as i32, act.code());
        with_dtype!(x.0.dtype(), T => {
            let (xv, wv, bv) = (view::<T>(x.0, x.1)?, view::<T>(w.0, w.1)?, view::<T>(b.0, b.1)?);
            let early = Early::begin(&dev, m)?;
            let out = alloc::<T>(&dev, m * n)?;
            early.launch()?;
            // SAFETY: x holds m·k, W n·k and b n elements, contiguous from 16-byte boundaries, k
            // a multiple of 32 (checked by `skinny`); out holds m·n; the null residual is none.
            let no_residual = 0u64;
            launch!(unsafe func, config(n, nt); &xv, &wv, &bv, &no_residual, &out, &m_i, &n_i, &k_i, &act)?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
        })
    }

    /// An LM head: no bias, no activation.
    struct Head;

    impl CustomOp2 for Head {
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
            // One row: two tiles, x in 4-byte loads; more: four tiles, x in 16-byte loads.
            let (func, nt) = if m == 1 {
                (kernel!(dev, PTX, "tb_skinny_head", x.dtype())?, 2)
            } else {
                (kernel!(dev, PTX, "tb_skinny_head_wide", x.dtype())?, 4)
            };
            let (m_i, n_i, k_i) = (m as i32, n as i32, k as i32);
            #[cfg(test)]
            super::HEAD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            with_dtype!(x.dtype(), T => {
                let (xv, wv) = (view::<T>(x, xl)?, view::<T>(w, wl)?);
                let early = Early::begin(&dev, m)?;
                let out = alloc::<T>(&dev, m * n)?;
                early.launch()?;
                // SAFETY: x holds m·k and W n·k elements, contiguous from 16-byte boundaries, k
                // a multiple of 32 (checked by `skinny`); out holds m·n.
                launch!(unsafe func, config(n, nt); &xv, &wv, &out, &m_i, &n_i, &k_i)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
            })
        }
    }

    struct Linear {
        act: Act,
    }

    impl CustomOp3 for Linear {
        fn name(&self) -> &'static str {
            "tb-skinny-linear"
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
            linear((x, xl), (w, wl), (b, bl), self.act)
        }
    }

    struct Fp8 {
        act: Act,
    }

    impl CustomOp3 for Fp8 {
        fn name(&self) -> &'static str {
            "tb-skinny-fp8"
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
            let (m, k) = xl.shape().dims2()?;
            let n = ql.shape().dims2()?.0;
            let nt = tiles(n, true);
            let func = match nt {
                1 => kernel!(dev, PTX, "tb_skinny_fp8_1", x.dtype())?,
                _ => kernel!(dev, PTX, "tb_skinny_fp8_4", x.dtype())?,
            };
            let (m_i, n_i, k_i, act) = (m as i32, n as i32, k as i32, self.act.code());
            let (qv, sbv) = (view::<F8E4M3>(q, ql)?, view::<f32>(sb, sbl)?);
            with_dtype!(x.dtype(), T => {
                let xv = view::<T>(x, xl)?;
                let early = Early::begin(&dev, m)?;
                let out = alloc::<T>(&dev, m * n)?;
                early.launch()?;
                // SAFETY: x holds m·k elements and q n·k bytes, contiguous from 16-byte
                // boundaries, k a multiple of 64 (checked by `skinny_fp8`); sb holds n
                // (scale, bias) pairs; out holds m·n.
                launch!(unsafe func, config(n, nt); &xv, &qv, &sbv, &out, &m_i, &n_i, &k_i, &act)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((m, n))))
            })
        }
    }

    /// Whether x (M, K) is bf16 / f16 on CUDA, at most [`MAX_ROWS`] rows, contiguous from a
    /// 16-byte boundary.
    fn takes(x: &Tensor) -> Result<bool> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let laid = x.rank() == 2 && x.is_contiguous() && aligned16(x);
        Ok(x.device().is_cuda() && half && laid && x.dim(0)? <= MAX_ROWS)
    }

    pub fn skinny(x: &Tensor, w: &Tensor, b: Option<&Tensor>, act: Act) -> Result<Option<Tensor>> {
        if !takes(x)? || w.rank() != 2 {
            return Ok(None);
        }
        let (k, (n, wk)) = (x.dim(1)?, w.dims2()?);
        let laid = w.is_contiguous() && aligned16(w) && w.dtype() == x.dtype();
        if wk != k || !k.is_multiple_of(32) || !laid {
            return Ok(None);
        }
        match b {
            None => Ok(Some(x.apply_op2_no_bwd(w, &Head)?)),
            Some(b) if b.dims() == [n] && b.dtype() == x.dtype() && b.is_contiguous() => {
                let small = n * k <= MAX_WEIGHT;
                Ok(small
                    .then(|| x.apply_op3_no_bwd(w, b, &Linear { act }))
                    .transpose()?)
            }
            Some(_) => Ok(None),
        }
    }

    pub fn skinny_fp8(x: &Tensor, q: &Tensor, sb: &Tensor, act: Act) -> Result<Option<Tensor>> {
        if !takes(x)? || q.rank() != 2 {
            return Ok(None);
        }
        let (k, (n, qk)) = (x.dim(1)?, q.dims2()?);
        let laid = q.is_contiguous() && aligned16(q) && sb.is_contiguous();
        let typed = q.dtype() == DType::F8E4M3 && sb.dtype() == DType::F32 && sb.dims() == [n, 2];
        if qk != k || !k.is_multiple_of(64) || !laid || !typed {
            return Ok(None);
        }
        Ok(Some(x.apply_op3_no_bwd(q, sb, &Fp8 { act })?))
    }
    /// Launches tb_skinny{NT} with a residual or tb_skinny_ln{NT} on operands
    /// [`skinny_tail`] checked.
    fn run_tail(x: &Tensor, w: &Tensor, tail: Tail<'_>, act: Act) -> Result<Tensor> {
        let ((m, k), n) = (x.dims2()?, w.dim(0)?);
        let (Some(xs), Some(ws)) = (cuda(x), cuda(w)) else {
            candle_core::bail!("the tensor-core projection takes CUDA tensors");
        };
        let dev = storage(&xs.0).device().clone();
        let nt = tiles(n, false);
        let kind = if matches!(tail, Tail::Norm { .. }) {
            "_ln"
        } else {
            ""
        };
        let name = projection_kernel_name(kind, nt, x.dtype())?;
        let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
        let (m_i, n_i, k_i, act) = (m as i32, n as i32, k as i32, act.code());
        // The operands' addresses, taken before Early's window (only the output's allocation
        // may be inside it).
        let (third, fourth, eps) = match tail {
            Tail::Add { b, r } => (device_address(b)?, device_address(r)?, 0f32),
            Tail::Norm { sb, eps } => (device_address(sb)?, 0, eps as f32),
        };
        #[cfg(test)]
        match tail {
            Tail::Add { .. } => &super::ADD_LAUNCHES,
            Tail::Norm { .. } => &super::LN_LAUNCHES,
        }
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(with_dtype!(x.dtype(), T => {
            let (xv, wv) = (view::<T>(storage(&xs.0), xs.1)?, view::<T>(storage(&ws.0), ws.1)?);
            let early = Early::begin(&dev, m)?;
            let out = alloc::<T>(&dev, m * n)?;
            early.launch()?;
            match kind {
                // SAFETY: x holds m·k and W n·k elements, contiguous from 16-byte boundaries, k a
                // multiple of 32, b n elements and r m·n, contiguous (checked by skinny_tail);
                // out holds m·n.
                "" => launch!(unsafe func, config(n, nt); &xv, &wv, &third, &fourth, &out, &m_i, &n_i, &k_i, &act)?,
                // SAFETY: as above; `third` is sb, n (Σ W, bias) pairs of f32.
                _ => launch!(unsafe func, config(n, nt); &xv, &wv, &third, &out, &m_i, &n_i, &k_i, &act, &eps)?,
            };
            wrap(out, &dev, (m, n))
        }))
    }

    pub fn skinny_tail(x: &Tensor, w: &Tensor, tail: Tail<'_>, act: Act) -> Result<Option<Tensor>> {
        if !takes(x)? || w.rank() != 2 {
            return Ok(None);
        }
        let ((m, k), (n, wk)) = (x.dims2()?, w.dims2()?);
        let fits = |t: &Tensor, dtype: DType, dims: &[usize]| {
            t.dtype() == dtype && t.dims() == dims && t.is_contiguous()
        };
        let tail_fits = match tail {
            Tail::Add { b, r } => fits(b, x.dtype(), &[n]) && fits(r, x.dtype(), &[m, n]),
            Tail::Norm { sb, .. } => fits(sb, DType::F32, &[n, 2]),
        };
        let laid = w.is_contiguous() && aligned16(w) && w.dtype() == x.dtype();
        let small = n * k <= MAX_WEIGHT;
        if m == 0 || wk != k || !k.is_multiple_of(32) || !laid || !small || !tail_fits {
            return Ok(None);
        }
        run_tail(x, w, tail, act).map(Some)
    }
}
