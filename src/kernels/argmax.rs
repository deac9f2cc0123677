//! The greedy pick over the vocabulary (`--fused decode`; kernels in argmax.cu): one block a
//! row, or long rows (BLOOM's 250880) in chunks and then the best of the chunks, banned ids
//! excluded, as `argmax_keepdim(1)` of the logits plus the ban.
//!
//! Inference only (no backward). Shapes: `B` rows (batch), `V` vocabulary.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// The first index of each row's largest logit + `ban` ((1, V) 0 or −inf, the logits' dtype):
/// logits (B, V) -> (B, 1) u32, as `argmax_keepdim(1)` of the sum.
pub fn argmax(logits: &Tensor, ban: Option<&Tensor>) -> Result<Option<Tensor>> {
    if !enabled(Fused::Decode) {
        return Ok(None);
    }
    imp::argmax(logits, ban)
}

/// Where a graphed decode keeps each step's pick (`--fused step-io`): `tokens` (B, N) u32,
/// the step at cache position `*cursor` ((1,) u32 on the device, advanced at the step's start)
/// writing column `*cursor − base`. `counters` ((B,) u32, zeros, left zero): the chunks of a
/// long row counted there, so that the last to finish picks the row's best (one launch).
pub struct Record<'a> {
    pub tokens: &'a Tensor,
    pub cursor: &'a Tensor,
    pub base: u32,
    pub counters: &'a Tensor,
}

/// Picks [`argmax_into`] wrote into a record, in this process (a GPU test checks that the
/// graphed steps record theirs).
#[cfg(test)]
pub static RECORDED_PICKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`argmax`] written into `ids` ((B, 1) u32, contiguous: a graphed step's input, in place)
/// and into `record` where given, instead of a new tensor that a copy then puts there.
/// False, nothing written, where it does not apply (then [`argmax`] and a copy).
pub fn argmax_into(
    logits: &Tensor,
    ban: Option<&Tensor>,
    ids: &Tensor,
    record: Option<Record<'_>>,
) -> Result<bool> {
    if !enabled(Fused::Decode) || !enabled(Fused::StepIo) {
        return Ok(false);
    }
    imp::argmax_into(logits, ban, ids, record)
}

/// The CPU runs candle's argmax.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn argmax(_: &Tensor, _: Option<&Tensor>) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn argmax_into(
        _: &Tensor,
        _: Option<&Tensor>,
        _: &Tensor,
        _: Option<super::Record<'_>>,
    ) -> Result<bool> {
        Ok(false)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Record;
    use crate::kernels::launch::{
        alloc, device_address, float_dtype, kernel, launch, ptx, wrap, Ptx, NULL,
    };
    use crate::kernels::pdl::Early;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::CudaDevice;
    use candle_core::{DType, Result, Tensor};

    const PTX: Ptx = ptx!("argmax");

    /// Rows longer than this are split over blocks (`tb_argmax_part`, then `tb_argmax_final`).
    const ARGMAX_ONE_BLOCK: usize = 16384;
    /// Columns a block of `tb_argmax_part`.
    const ARGMAX_CHUNK: usize = 2048;

    /// Launches the pick into `$out` (B u32: a new allocation, or an address), one block a row
    /// or, for long rows, the chunks' kernel and then the final one; `$early` opened before
    /// `$out`'s allocation.
    macro_rules! pick {
        ($dev:expr, $p:expr, $out:expr, $early:expr) => {{
            let (dev, p): (&CudaDevice, &Pick) = ($dev, $p);
            let (rec_t, rec_c, base, cols) = p.rec;
            if p.v <= ARGMAX_ONE_BLOCK {
                let func = kernel!(dev, PTX, "tb_argmax", p.dtype)?;
                let v_i = p.v as i32;
                let cfg = LaunchConfig {
                    grid_dim: (p.b as u32, 1, 1),
                    block_dim: (1024, 1, 1),
                    shared_mem_bytes: 0,
                };
                $early.launch()?;
                // SAFETY: x holds B·V elements of its dtype, ban (where not null) V, out B;
                // the record (where not null) B rows of `cols` and the cursor one u32.
                launch!(unsafe func, cfg; &p.x, &p.ban, $out, &rec_t, &rec_c, &base, &cols, &v_i)?;
            } else if p.counters != NULL {
                // The chunks, the last of a row picking its best: one launch.
                let part = kernel!(dev, PTX, "tb_argmax_part_last", p.dtype)?;
                let chunks = p.v.div_ceil(ARGMAX_CHUNK);
                let early = $early; // the partials allocated in its window, as `$out` may be
                let (part_v, part_i) = (
                    alloc::<f32>(dev, p.b * chunks)?,
                    alloc::<i32>(dev, p.b * chunks)?,
                );
                let (v_i, chunk_i) = (p.v as i32, ARGMAX_CHUNK as i32);
                let cfg = LaunchConfig {
                    grid_dim: (chunks as u32, p.b as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                early.launch()?;
                // SAFETY: x holds B·V elements, ban V, the partials B·chunks, the counters B
                // (zero, left zero), out B; the record as above.
                launch!(unsafe part, cfg; &p.x, &p.ban, &part_v, &part_i, &v_i, &chunk_i,
                    &p.counters, $out, &rec_t, &rec_c, &base, &cols)?;
            } else {
                let part = kernel!(dev, PTX, "tb_argmax_part", p.dtype)?;
                let fin = dev.get_or_load_custom_func("tb_argmax_final", PTX.module, PTX.text)?;
                let chunks = p.v.div_ceil(ARGMAX_CHUNK);
                // The partials allocated in `$early`'s window, after `$out` where it is a new
                // allocation: the window holds allocations only, and the partials' kernel keeps
                // its programmatic edge.
                let early = $early;
                let (part_v, part_i) = (
                    alloc::<f32>(dev, p.b * chunks)?,
                    alloc::<i32>(dev, p.b * chunks)?,
                );
                let (v_i, chunk_i, chunks_i) = (p.v as i32, ARGMAX_CHUNK as i32, chunks as i32);
                let cfg = LaunchConfig {
                    grid_dim: (chunks as u32, p.b as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                early.launch()?;
                // SAFETY: x holds B·V elements, ban V, the partials B·chunks.
                launch!(unsafe part, cfg; &p.x, &p.ban, &part_v, &part_i, &v_i, &chunk_i)?;
                let cfg = LaunchConfig {
                    grid_dim: (p.b as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                Early::begin(dev, p.b)?.launch()?;
                // SAFETY: the partials hold B·chunks values, out B; the record as above.
                launch!(unsafe fin, cfg; &part_v, &part_i, $out, &rec_t, &rec_c, &base, &cols,
                    &chunks_i)?;
            }
        }};
    }

    /// A pick's operands as device addresses: the logits (B, V) and ban, and the record's
    /// tokens, cursor, base and columns (nulls and zeros without one).
    struct Pick {
        b: usize,
        v: usize,
        dtype: DType,
        x: u64,
        ban: u64,
        rec: (u64, u64, i32, i32),
        /// The record's chunk counters (B u32), or null.
        counters: u64,
        /// The contiguous logits and ban the addresses point into, alive while the pick is.
        _keep: (Tensor, Option<Tensor>),
    }

    /// The pick's operands, or None where the kernels do not take them.
    fn operands(
        logits: &Tensor,
        ban: Option<&Tensor>,
        rec: Option<&Record>,
    ) -> Result<Option<Pick>> {
        let (b, v) = logits.dims2()?;
        let ban_ok = ban.is_none_or(|t| t.dtype() == logits.dtype() && t.elem_count() == v);
        let rec_ok = rec.is_none_or(|r| {
            let u32s = r.tokens.dtype() == DType::U32 && r.cursor.dtype() == DType::U32;
            let u32s = u32s && r.counters.dtype() == DType::U32;
            let laid = r.tokens.rank() == 2 && r.tokens.is_contiguous() && r.cursor.is_contiguous();
            let counted = r.counters.dims() == [b] && r.counters.is_contiguous();
            u32s && laid
                && counted
                && r.tokens.dim(0).is_ok_and(|n| n == b)
                && r.cursor.dims() == [1]
        });
        if !logits.device().is_cuda() || !float_dtype(logits) || !ban_ok || !rec_ok {
            return Ok(None);
        }
        let x = logits.contiguous()?;
        let ban = ban.map(|t| t.contiguous()).transpose()?;
        let counters = rec.map_or(Ok(NULL), |r| device_address(r.counters))?;
        let rec = match rec {
            Some(r) => (
                device_address(r.tokens)?,
                device_address(r.cursor)?,
                r.base as i32,
                r.tokens.dim(1)? as i32,
            ),
            None => (NULL, NULL, 0, 0),
        };
        Ok(Some(Pick {
            b,
            v,
            dtype: x.dtype(),
            x: device_address(&x)?,
            ban: ban.as_ref().map_or(Ok(NULL), device_address)?,
            rec,
            counters,
            _keep: (x, ban),
        }))
    }

    pub fn argmax(logits: &Tensor, ban: Option<&Tensor>) -> Result<Option<Tensor>> {
        let Some(p) = operands(logits, ban, None)? else {
            return Ok(None);
        };
        let dev = logits.device().as_cuda_device()?.clone();
        let early = Early::begin(&dev, p.b)?;
        let out = alloc::<u32>(&dev, p.b)?;
        pick!(&dev, &p, &out, early);
        Ok(Some(wrap(out, &dev, (p.b, 1))))
    }

    pub fn argmax_into(
        logits: &Tensor,
        ban: Option<&Tensor>,
        ids: &Tensor,
        record: Option<Record<'_>>,
    ) -> Result<bool> {
        let ids_ok = ids.dtype() == DType::U32 && ids.is_contiguous();
        let Some(p) = operands(logits, ban, record.as_ref())? else {
            return Ok(false);
        };
        if !ids_ok || ids.elem_count() != p.b {
            return Ok(false);
        }
        let dev = logits.device().as_cuda_device()?.clone();
        #[cfg(test)]
        if record.is_some() {
            super::RECORDED_PICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let out = device_address(ids)?;
        let early = Early::begin(&dev, p.b)?;
        pick!(&dev, &p, &out, early);
        Ok(true)
    }
}
