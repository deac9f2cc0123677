//! Causal attention over whole sequences for inference (`--fused prefill`; kernel in
//! flash_prefill.cu): the scoring forward's attention as one tensor-core kernel that reads
//! the qkv projection's rows in place (either head layout, [`QkvLayout`]) and writes the
//! output with the heads merged, ALiBi added where slopes are given. The composed path's head
//! split and merge copies and its (B, nh, T, T) scores and bias are gone.
//!
//! Applies to bf16 / f16 on CUDA, head sizes 64 and 128 ([`prefill_applies`]). The sequences
//! are right-padded rows of a batch, or packed end to end without padding ([`SeqRows`]). Rows
//! at or past a sequence's length come out zero; a real row attends only real keys, so they
//! are exact.
//!
//! A generation's prefill takes the same kernel over its prompts' real tokens packed; their
//! keys and values then go into its KV cache where left padding puts them ([`prefill_kv`]).
//!
//! Shapes: `B` sequences, `T` padded time, `N` packed rows, `nh` heads, `hs` head size,
//! `C` = nh·hs.

use super::{enabled, Fused, QkvLayout};
use candle_core::{DType, Device, Result, Tensor};

/// Where each sequence's rows are.
#[derive(Clone, Copy)]
pub struct SeqRows<'a> {
    /// (B,) u32: each sequence's length.
    pub lens: &'a Tensor,
    /// (B,) u32: each sequence's first row, packed (qkv (1, N, 3C)); None: right-padded rows
    /// of qkv (B, T, 3C), sequence b from row b·T.
    pub starts: Option<&'a Tensor>,
    /// The longest sequence (the grid's query tiles); padded: T.
    pub longest: usize,
}

/// Whether the kernel runs for a model of `dtype` on `device` with heads of `hs`.
pub fn prefill_applies(dtype: DType, device: &Device, hs: usize) -> bool {
    let half = matches!(dtype, DType::BF16 | DType::F16);
    let built = cfg!(feature = "cuda") && device.is_cuda();
    enabled(Fused::Prefill) && built && half && matches!(hs, 64 | 128)
}

/// y (B, T, C) of softmax(q kᵀ·scale + causal [+ ALiBi]) v for each sequence's first
/// `lens[b]` rows (zeros past them), from qkv (B, T, 3C) laid out as `layout`, `nh` heads of
/// `hs`; packed, y (1, N, C) from qkv (1, N, 3C). slopes: (nh,) f32 ALiBi slopes, or None.
/// None where the kernel does not apply ([`prefill_applies`], rows not 16-byte aligned).
pub fn flash_prefill(
    qkv: &Tensor,
    layout: QkvLayout,
    (nh, hs): (usize, usize),
    rows: SeqRows,
    slopes: Option<&Tensor>,
    scale: f64,
) -> Result<Option<Tensor>> {
    if !prefill_applies(qkv.dtype(), qkv.device(), hs) {
        return Ok(None);
    }
    imp::flash_prefill(qkv, layout, (nh, hs), rows, slopes, scale)
}

/// A generation's prefill run packed: writes the keys and values of qkv (1, N, 3C) (laid out
/// as `layout`, `nh` heads of `hs`; `rows` packed) into a layer's KV cache k, v (B, nh, T_max,
/// hs) where the left-padded prompts put them: sequence b's row j at column `end − lens[b] + j`
/// (`end`: the padded prompts' length); its padding columns (before `end − lens[b]`) zeroed,
/// the columns from `end` on untouched. Returns false where the kernel does not apply
/// ([`prefill_applies`] of qkv, rows not 16-byte aligned); an error for shapes, dtypes or
/// devices that do not fit (`check_kv`).
pub fn prefill_kv(
    qkv: &Tensor,
    layout: QkvLayout,
    (nh, hs): (usize, usize),
    rows: SeqRows,
    (k, v): (&Tensor, &Tensor),
    end: usize,
) -> Result<bool> {
    if !prefill_applies(qkv.dtype(), qkv.device(), hs) {
        return Ok(false);
    }
    imp::prefill_kv(qkv, layout, (nh, hs), rows, (k, v), end)
}

/// The CPU runs the matmuls and candle's softmax.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::SeqRows;
    use crate::kernels::QkvLayout;
    use candle_core::{Result, Tensor};

    pub fn prefill_kv(
        _: &Tensor,
        _: QkvLayout,
        _: (usize, usize),
        _: SeqRows,
        _: (&Tensor, &Tensor),
        _: usize,
    ) -> Result<bool> {
        Ok(false)
    }

    pub fn flash_prefill(
        _: &Tensor,
        _: QkvLayout,
        _: (usize, usize),
        _: SeqRows,
        _: Option<&Tensor>,
        _: f64,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::SeqRows;
    use crate::kernels::launch::{
        aligned16, cuda, device_address, kernel, launch, no_cpu_fwd, ptx, storage, view,
        with_dtype, Ptx, NULL,
    };
    use crate::kernels::QkvLayout;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{bail, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("flash_prefill");
    const TILE: usize = 64;
    const WARPS: usize = 4;
    const LOG2_E: f64 = std::f64::consts::LOG2_E;

    /// Dynamic shared memory of a block (flash_prefill.cu's prefill_shared_elems): two key and
    /// two value tiles at row stride hs + 8, and each warp's 16 × (TILE + 8) probabilities.
    fn shared_bytes(hs: usize, elem: usize) -> u32 {
        ((4 * TILE * (hs + 8) + WARPS * 16 * (TILE + 8)) * elem) as u32
    }

    struct Prefill {
        nh: usize,
        hs: usize,
        layout: QkvLayout,
        scale2: f32,
        lens: Tensor,           // (B,) u32, contiguous
        starts: Option<Tensor>, // (B,) u32, contiguous
        longest: usize,
        slopes: Option<Tensor>, // (nh,) f32, contiguous
    }

    impl CustomOp1 for Prefill {
        fn name(&self) -> &'static str {
            "tb-flash-prefill"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, qkv: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = qkv.device().clone();
            let (b, t, c3) = l.shape().dims3()?;
            let func = match self.hs {
                64 => kernel!(dev, PTX, "tb_flash_prefill64", qkv.dtype())?,
                _ => kernel!(dev, PTX, "tb_flash_prefill128", qkv.dtype())?,
            };
            let shared = shared_bytes(self.hs, qkv.dtype().size_in_bytes());
            let max_shared =
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            func.set_attribute(max_shared, shared as i32).w()?;
            let seqs = self.lens.dim(0)?;
            let cfg = LaunchConfig {
                grid_dim: (
                    self.longest.div_ceil(TILE) as u32,
                    (seqs * self.nh) as u32,
                    1,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: shared,
            };
            let ints = [t, self.nh, self.layout.head_stride, self.layout.part].map(|v| v as i32);
            let lens = device_address(&self.lens)?;
            let starts = self.starts.as_ref().map_or(Ok(NULL), device_address)?;
            let slopes = self.slopes.as_ref().map_or(Ok(NULL), device_address)?;
            with_dtype!(qkv.dtype(), T => {
                let x = view::<T>(qkv, l)?;
                // Rows past a sequence's length are not written: zeros, not stale memory.
                let y = dev.alloc_zeros::<T>(b * t * c3 / 3)?;
                // SAFETY: qkv holds B·T·3C elements (packed: N·3C), y B·T·C (N·C), lens and
                // starts B u32 (checked by flash_prefill against the rows), slopes (when not
                // null) nh f32; a block reads rows < lens[b] of its sequence and writes its
                // head's columns of those rows only.
                launch!(unsafe func, cfg; &x, &y, &lens, &starts, &ints[0], &ints[1], &ints[2],
                    &ints[3], &self.scale2, &slopes)?;
                Ok((CudaStorage::wrap_cuda_slice(y, dev), Shape::from((b, t, c3 / 3))))
            })
        }
    }

    pub fn flash_prefill(
        qkv: &Tensor,
        layout: QkvLayout,
        (nh, hs): (usize, usize),
        rows: SeqRows,
        slopes: Option<&Tensor>,
        scale: f64,
    ) -> Result<Option<Tensor>> {
        let (b, t, c3) = qkv.dims3()?;
        let aligned =
            aligned16(qkv) && layout.head_stride.is_multiple_of(8) && layout.part.is_multiple_of(8);
        if !aligned {
            return Ok(None);
        }
        let seqs = match rows.starts {
            Some(_) if b == 1 => rows.lens.dim(0)?, // packed
            Some(_) => bail!("flash prefill: packed rows come as (1, N, 3C), not {b} rows"),
            None if rows.longest == t => b,
            None => bail!(
                "flash prefill: padded rows of {t}, longest {}",
                rows.longest
            ),
        };
        let u32_of = |x: &Tensor| x.dims() == [seqs] && x.dtype() == DType::U32;
        if c3 != 3 * nh * hs || !u32_of(rows.lens) || !rows.starts.is_none_or(u32_of) {
            bail!(
                "flash prefill: qkv {:?}, {nh} heads of {hs}, lens {:?}",
                qkv.shape(),
                rows.lens.shape()
            );
        }
        if let Some(s) = slopes.filter(|s| s.dims() != [nh] || s.dtype() != DType::F32) {
            bail!("flash prefill: {nh} heads but ALiBi slopes {:?}", s.shape())
        }
        let op = Prefill {
            nh,
            hs,
            layout,
            scale2: (scale * LOG2_E) as f32,
            lens: rows.lens.contiguous()?,
            starts: rows.starts.map(Tensor::contiguous).transpose()?,
            longest: rows.longest,
            slopes: slopes.map(Tensor::contiguous).transpose()?,
        };
        Ok(Some(qkv.apply_op1_no_bwd(&op)?))
    }

    /// The shapes prefill_kv takes: qkv (1, N, 3C) of `nh` heads of `hs`, caches (B, nh, T_max,
    /// hs) of qkv's dtype on its device, lens and packed starts (B,) u32, `end` ≤ T_max and at
    /// least the longest sequence. Returns (B, T_max).
    fn check_kv(
        qkv: &Tensor,
        (nh, hs): (usize, usize),
        rows: SeqRows,
        (k, v): (&Tensor, &Tensor),
        end: usize,
    ) -> Result<(usize, usize)> {
        let (one, _, c3) = qkv.dims3()?;
        let (b, nh_k, t_max, hs_k) = k.dims4()?;
        let u32_of = |x: &Tensor| x.dims() == [b] && x.dtype() == DType::U32;
        let shapes =
            one == 1 && c3 == 3 * nh * hs && (nh_k, hs_k) == (nh, hs) && v.dims() == k.dims();
        let same_dtype = k.dtype() == qkv.dtype() && v.dtype() == qkv.dtype();
        let same_device = [k, v].iter().all(|c| c.device().same_device(qkv.device()));
        let packed = rows.starts.is_some_and(u32_of) && u32_of(rows.lens);
        if !(shapes && same_dtype && same_device && packed) || rows.longest > end || end > t_max {
            bail!(
                "prefill kv: qkv {:?} ({nh} heads of {hs}) into caches {:?} / {:?} of {:?} up to column {end}, lens {:?}, packed {}: make the caches with the model's new_cache and the rows with WholeSequences::packed",
                qkv.shape(),
                k.shape(),
                v.shape(),
                k.dtype(),
                rows.lens.shape(),
                rows.starts.is_some()
            );
        }
        Ok((b, t_max))
    }

    pub fn prefill_kv(
        qkv: &Tensor,
        layout: QkvLayout,
        (nh, hs): (usize, usize),
        rows: SeqRows,
        (k, v): (&Tensor, &Tensor),
        end: usize,
    ) -> Result<bool> {
        let (b, t_max) = check_kv(qkv, (nh, hs), rows, (k, v), end)?;
        // 16-byte vectors of 2-byte elements (bf16 / f16: prefill_applies).
        let whole_vectors = [layout.head_stride, layout.part, hs]
            .iter()
            .all(|n| n.is_multiple_of(8));
        let Some((s, _)) = cuda(qkv) else {
            return Ok(false);
        };
        if !whole_vectors || ![qkv, k, v].into_iter().all(aligned16) {
            return Ok(false);
        }
        let dev = storage(&s).device().clone();
        drop(s);
        let func = kernel!(dev, PTX, "tb_prefill_kv")?;
        let starts = rows.starts.expect("check_kv: packed");
        let (lens, starts) = (device_address(rows.lens)?, device_address(starts)?);
        let (qkv_p, k_p, v_p) = (device_address(qkv)?, device_address(k)?, device_address(v)?);
        let vectors = end * nh * hs / 8; // a sequence's, padding columns included
        let cfg = LaunchConfig {
            grid_dim: (vectors.div_ceil(256).clamp(1, 1024) as u32, b as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let c3 = 3 * nh * hs;
        let ints = [
            nh,
            hs / 8,
            layout.head_stride / 8,
            layout.part / 8,
            c3 / 8,
            t_max,
            end,
        ]
        .map(|n| n as i32);
        // SAFETY: the caches hold B·nh·T_max·hs elements each and a thread writes only columns
        // below end ≤ T_max of its own sequence's rows (check_kv); lens and starts hold B u32
        // (check_kv). The rows read, starts[b] + j for j < lens[b], lie inside qkv's N rows
        // when lens and starts are a packing of those rows (WholeSequences::packed of the
        // lens the rows were gathered by: KvCache::packed_prompts), and lens[b] ≤ end (the
        // longest, checked against end, comes from the same lens). Every access is a 16-byte
        // vector at a 16-byte boundary (checked above).
        launch!(unsafe func, cfg; &qkv_p, &k_p, &v_p, &lens, &starts, &ints[0], &ints[1],
            &ints[2], &ints[3], &ints[4], &ints[5], &ints[6])?;
        Ok(true)
    }
}
