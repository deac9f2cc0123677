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
    imp::gemv(
        x,
        w,
        Tail::Bias {
            b: Some(b),
            r: None,
            stats: None,
        },
        act,
    )
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
    imp::gemv(
        x,
        w,
        Tail::Bias {
            b: None,
            r: None,
            stats: None,
        },
        Act::None,
    )
}

/// x Wᵀ + b + r at 1–4 rows (`--fused norm-fold`): a branch's last projection with the residual
/// add in its epilogue, r (M, N) like the output, the sum rounded as the add kernel rounds it;
/// with `stats` (a norm's slots, [`NORM_SLOTS`], zero before: `--fused norm-stats`, one row),
/// the next norm's statistics of the output added into them. None where [`gemv`] would not
/// apply or the path is off.
pub fn gemv_add(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    r: &Tensor,
    stats: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::Gemv) || !enabled(Fused::NormFold) {
        return Ok(None);
    }
    let stats = stats.filter(|_| enabled(Fused::NormStats));
    imp::gemv(
        x,
        w,
        Tail::Bias {
            b: Some(b),
            r: Some(r),
            stats,
        },
        Act::None,
    )
}

/// Slots of a norm's statistics (one row: `--fused norm-stats` folds one), each the block
/// residue's (Σ y, Σ y²) in the first two f64 of its own 128-byte line of [`NORM_LINE`] (gemv.cu:
/// adds to one line queue): a norm's slots are a (NORM_SLOTS, NORM_LINE) f64 tensor.
pub const NORM_SLOTS: usize = 32;
/// f64 a slot's line holds.
pub const NORM_LINE: usize = 16;

/// A folded GEMV's slots (`--fused norm-stats`): `stats`, as [`gemv_add`] left them for its
/// input (None: the GEMV sums the statistics itself), and `clear`, the slots of the norm
/// before it, whose folded GEMV has run, which it zeroes for the next step.
#[derive(Clone, Copy)]
pub struct Summed<'a> {
    pub stats: Option<&'a Tensor>,
    pub clear: &'a Tensor,
}

/// act(LN(x) Wᵀ + b) at 1–4 rows for x the residual stream before its LayerNorm, whose weight
/// and bias [`crate::models::norm_fold`] folded into W and b: sb (N, 2) f32 holds each column's
/// Σₖ W[n, k] and the folded bias (`--fused norm-fold`). The norm's statistics come from the
/// GEMV's own loads of x, or with `summed` (`--fused norm-stats`) from the slots the GEMV that
/// wrote x summed them into. None where [`gemv`] would not apply or the path is off.
pub fn gemv_ln(
    x: &Tensor,
    w: &Tensor,
    sb: &Tensor,
    act: Act,
    eps: f64,
    summed: Option<Summed<'_>>,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::Gemv) || !enabled(Fused::NormFold) {
        return Ok(None);
    }
    let summed = summed.filter(|_| enabled(Fused::NormStats));
    imp::gemv(x, w, Tail::Norm { sb, eps, summed }, act)
}

/// Launches of [`gemv_ln`]'s kernel in this process (a GPU test checks that decoding takes it).
#[cfg(test)]
pub static LN_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Launches of the wide one-row kernels (`--fused gemv-wide`; a GPU test checks which calls
/// take them).
#[cfg(test)]
pub static WIDE_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Launches of the folded GEMV that reads summed statistics (a GPU test checks decoding).
#[cfg(test)]
pub static SUMMED_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The kernel's operands after W: the bias (or none), the residual (or none) and the next
/// norm's slots (or none), or a folded norm's sums, epsilon and summed statistics (or none).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum Tail<'a> {
    Bias {
        b: Option<&'a Tensor>,
        r: Option<&'a Tensor>,
        stats: Option<&'a Tensor>,
    },
    Norm {
        sb: &'a Tensor,
        eps: f64,
        summed: Option<Summed<'a>>,
    },
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{Act, Tail};
    use candle_core::{Result, Tensor};

    pub fn gemv(_: &Tensor, _: &Tensor, _: Tail<'_>, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{Act, Tail, MAX_ROWS, NORM_LINE, NORM_SLOTS};
    use crate::kernels::launch::{
        aligned16, alloc, cuda, device_address, launch, ptx, storage, suffix, view, with_dtype,
        wrap, Ptx, NULL,
    };
    use crate::kernels::pdl::Early;
    use crate::kernels::{enabled, Fused};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaDevice, DType, Result, Tensor};

    const PTX: Ptx = ptx!("gemv");

    /// Output columns a block computes (gemv.cuh's COLS; gemv.cu takes one for one row), and
    /// warps a column (its SPLIT).
    const COLS_PER_BLOCK: usize = 2;
    const WARPS_PER_COL: u32 = 4;

    /// Warps of a wide block (gemv.cu's WIDE_WARPS), and the vectors of a row the wide kernels
    /// take: four a lane (K ≤ 1024 in bf16), or eight a lane of two warps a column (K ≤ 4096;
    /// ROW_WPC).
    const WIDE_WARPS: usize = 8;
    const WIDE_KV: usize = 4 * 32;
    const ROW_WPC: usize = 2;
    const ROW_KV: usize = 8 * 32 * ROW_WPC;
    /// Columns a warp of a wide block takes at most (gemv.cu's instances).
    const WIDE_MAX_CPW: usize = 4;

    /// `--fused gemv-wide` at one row: the wide kernel's name and grid where one takes the
    /// call: a folded norm without slots (tb_wgemv_ln{cpw}) or a bias (not the LM head's none)
    /// and no slots (tb_wgemv{cpw}) at K ≤ 1024, cpw columns a warp, the fewest that keep the
    /// blocks to one an SM; a bias at K ≤ 4096 (tb_wgemv_row, ROW_WPC warps a column).
    fn wide_plan(
        tail: &Tail<'_>,
        n: usize,
        kv: usize,
        dev: &CudaDevice,
    ) -> Result<Option<(String, usize)>> {
        let stem = match tail {
            Tail::Norm { summed: None, .. } if kv <= WIDE_KV => "_ln",
            Tail::Bias {
                b: Some(_),
                stats: None,
                ..
            } if kv <= WIDE_KV => "",
            Tail::Bias {
                b: Some(_),
                stats: None,
                ..
            } if kv <= ROW_KV => {
                let blocks = n.div_ceil(WIDE_WARPS / ROW_WPC);
                return Ok(Some(("tb_wgemv_row".into(), blocks)));
            }
            _ => return Ok(None),
        };
        let cpw = n
            .div_ceil(WIDE_WARPS * sm_count(dev)?)
            .clamp(1, WIDE_MAX_CPW);
        Ok(Some((
            format!("tb_wgemv{stem}{cpw}"),
            n.div_ceil(WIDE_WARPS * cpw),
        )))
    }

    /// The SM count of `dev`, asked once a device ordinal (eager decoding plans a wide GEMV at
    /// every projection).
    fn sm_count(dev: &CudaDevice) -> Result<usize> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
        use candle_core::cuda_backend::WrapErr as _;
        use std::sync::Mutex;
        static KNOWN: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
        let context = dev.cuda_stream().context().clone();
        let ordinal = context.ordinal();
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, sms)) = known.iter().find(|(o, _)| *o == ordinal) {
            return Ok(sms);
        }
        let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        let sms = context.attribute(attribute).w()?.max(1) as usize;
        known.push((ordinal, sms));
        Ok(sms)
    }

    /// Launches tb_gemv{M} (a bias and a residual, each optional) or tb_gemv_ln{M} (a folded
    /// norm) on operands [`gemv`] checked, or at one row with `gemv-wide` a wide kernel.
    fn run(x: &Tensor, w: &Tensor, tail: Tail<'_>, act: Act) -> Result<Tensor> {
        let (m, k) = x.dims2()?;
        let n = w.dim(0)?;
        let (Some(xs), Some(ws)) = (cuda(x), cuda(w)) else {
            candle_core::bail!("the decode GEMV takes CUDA tensors");
        };
        let dev = storage(&xs.0).device().clone();
        let kv = k * x.dtype().size_in_bytes() / 16;
        if m == 1 && enabled(Fused::GemvWide) {
            if let Some((name, blocks)) = wide_plan(&tail, n, kv, &dev)? {
                drop((xs, ws));
                return run_wide(x, w, tail, act, &name, blocks);
            }
        }
        let kind = match tail {
            Tail::Bias { .. } => "",
            Tail::Norm { summed, .. } if summed.is_some_and(|s| s.stats.is_some()) => "_lns",
            Tail::Norm { .. } => "_ln",
        };
        let name = format!("tb_gemv{kind}{}_{}", m.min(MAX_ROWS), suffix(x.dtype())?);
        let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
        let kv = kv as i32;
        let (n_i, act) = (n as i32, act.code());
        let cols = if m == 1 { 1 } else { COLS_PER_BLOCK };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(cols) as u32, 1, 1),
            block_dim: (32 * WARPS_PER_COL * cols as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // The optional operands' addresses (and the norm's epsilon), taken before Early's
        // window, which must hold nothing but the output's allocation.
        let address = |t: Option<&Tensor>| t.map_or(Ok(NULL), device_address);
        // Bias: (b, r, stats); Norm: (sb, the summed stats, the slots to clear).
        let (third, fourth, fifth, residual, eps) = match tail {
            Tail::Bias { b, r, stats } => {
                let (b, r, s) = (address(b)?, address(r)?, address(stats)?);
                (b, r, s, true, 0f32)
            }
            Tail::Norm { sb, eps, summed } => {
                #[cfg(test)]
                count_ln(summed.is_some_and(|s| s.stats.is_some()));
                let s = address(summed.and_then(|s| s.stats))?;
                let c = address(summed.map(|s| s.clear))?;
                // Slots read and cleared at once would race with block 0's clear.
                debug_assert!(
                    s == NULL || s != c,
                    "norm-stats: the slots read are those cleared"
                );
                (device_address(sb)?, s, c, false, eps as f32)
            }
        };
        Ok(with_dtype!(x.dtype(), T => {
            let (xv, wv) = (view::<T>(storage(&xs.0), xs.1)?, view::<T>(storage(&ws.0), ws.1)?);
            let early = Early::begin(&dev, m)?;
            let out = alloc::<T>(&dev, m * n)?;
            early.launch()?;
            match residual {
                // SAFETY: x holds m·k, W n·k, b (where not null) n, r (where not null) m·n and
                // stats (where not null, m = 1) NORM_SLOTS·NORM_LINE f64, contiguous, x and W from
                // 16-byte boundaries in whole vectors (checked by gemv); out holds m·n; a null
                // b, r or stats is read as none.
                true => launch!(unsafe func, cfg; &xv, &wv, &third, &fourth, &fifth, &out, &n_i, &kv, &act)?,
                // SAFETY: as above; `third` is sb, n (Σ W, bias) pairs of f32; the stats and
                // the slots to clear (each null or, m = 1, NORM_SLOTS·NORM_LINE f64, checked
                // by gemv).
                false => launch!(unsafe func, cfg; &xv, &wv, &third, &fourth, &fifth, &out, &n_i, &kv, &act, &eps)?,
            };
            wrap(out, &dev, (m, n))
        }))
    }

    /// The wide kernel `name` over `blocks` blocks of WIDE_WARPS warps (wide_plan's), on a
    /// bias and an optional residual or on a folded norm.
    fn run_wide(
        x: &Tensor,
        w: &Tensor,
        tail: Tail<'_>,
        act: Act,
        name: &str,
        blocks: usize,
    ) -> Result<Tensor> {
        let (k, n) = (x.dim(1)?, w.dim(0)?);
        let address = |t: Option<&Tensor>| t.map_or(Ok(NULL), device_address);
        // Bias: (b, r); Norm: (sb, ε).
        let (third, fourth, eps, norm) = match tail {
            Tail::Bias { b, r, .. } => (address(b)?, address(r)?, 0f32, false),
            Tail::Norm { sb, eps, .. } => (device_address(sb)?, NULL, eps as f32, true),
        };
        let (Some(xs), Some(ws)) = (cuda(x), cuda(w)) else {
            candle_core::bail!("the decode GEMV takes CUDA tensors");
        };
        let dev = storage(&xs.0).device().clone();
        #[cfg(test)]
        {
            super::WIDE_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if norm {
                count_ln(false);
            }
        }
        let func = dev.get_or_load_custom_func(
            &format!("{name}_{}", suffix(x.dtype())?),
            PTX.module,
            PTX.text,
        )?;
        let (n_i, kv, act) = (
            n as i32,
            (k * x.dtype().size_in_bytes() / 16) as i32,
            act.code(),
        );
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32 * WIDE_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        Ok(with_dtype!(x.dtype(), T => {
            let (xv, wv) = (view::<T>(storage(&xs.0), xs.1)?, view::<T>(storage(&ws.0), ws.1)?);
            let early = Early::begin(&dev, 1)?;
            let out = alloc::<T>(&dev, n)?;
            early.launch()?;
            match norm {
                // SAFETY: x holds k, W n·k, b n, r (where not null) n, contiguous, x and W from
                // 16-byte boundaries in whole vectors, k within the kernel's (checked by gemv
                // and wide_plan); out holds n.
                false => launch!(unsafe func, cfg; &xv, &wv, &third, &fourth, &out, &n_i, &kv, &act)?,
                // SAFETY: as above; `third` is sb, n (Σ W, bias) pairs of f32.
                true => launch!(unsafe func, cfg; &xv, &wv, &third, &out, &n_i, &kv, &act, &eps)?,
            };
            wrap(out, &dev, (1, n))
        }))
    }

    /// Whether `t` is a contiguous (`dims`) tensor of `dtype` (the optional operands).
    fn fits(t: &Tensor, dtype: DType, dims: &[usize]) -> bool {
        t.dtype() == dtype && t.dims() == dims && t.is_contiguous()
    }

    /// Whether `t` holds a norm's slots for m rows: one row, (NORM_SLOTS, NORM_LINE) f64,
    /// 16-byte aligned.
    fn slots_fit(t: &Tensor, m: usize) -> bool {
        m == 1 && fits(t, DType::F64, &[NORM_SLOTS, NORM_LINE]) && aligned16(t)
    }

    #[cfg(test)]
    fn count_ln(summed: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        super::LN_LAUNCHES.fetch_add(1, Relaxed);
        if summed {
            super::SUMMED_LAUNCHES.fetch_add(1, Relaxed);
        }
    }

    pub fn gemv(x: &Tensor, w: &Tensor, tail: Tail<'_>, act: Act) -> Result<Option<Tensor>> {
        let half = matches!(x.dtype(), DType::BF16 | DType::F16);
        let shaped = matches!(act, Act::None | Act::GeluTanh) && x.rank() == 2 && w.rank() == 2;
        if !x.device().is_cuda() || !half || !shaped || x.dim(0)? > MAX_ROWS {
            return Ok(None);
        }
        let ((m, k), (n, wk)) = (x.dims2()?, w.dims2()?);
        let whole = (k * x.dtype().size_in_bytes()).is_multiple_of(16);
        let tail_fits = match &tail {
            Tail::Bias { b, r, stats } => {
                b.is_none_or(|b| fits(b, x.dtype(), &[n]))
                    && r.is_none_or(|r| fits(r, x.dtype(), &[m, n]))
                    && stats.is_none_or(|s| slots_fit(s, m))
            }
            Tail::Norm { sb, summed, .. } => {
                let slots = |s: super::Summed| {
                    s.stats.is_none_or(|t| slots_fit(t, m)) && slots_fit(s.clear, m)
                };
                fits(sb, DType::F32, &[n, 2]) && summed.is_none_or(slots)
            }
        };
        let same = w.dtype() == x.dtype() && tail_fits;
        let laid = x.is_contiguous() && w.is_contiguous();
        if m == 0 || wk != k || !whole || !same || !laid || !aligned16(x) || !aligned16(w) {
            return Ok(None);
        }
        run(x, w, tail, act).map(Some)
    }
}
