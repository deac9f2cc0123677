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

/// The CPU runs candle's argmax.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn argmax(_: &Tensor, _: Option<&Tensor>) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::launch::{
        alloc, cuda, float_dtype, kernel, launch, ptx, storage, view, with_dtype, wrap, Ptx, NULL,
    };
    use crate::kernels::pdl::Early;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg as _};
    use candle_core::cuda_backend::WrapErr as _;
    use candle_core::{Layout, Result, StorageRef, Tensor};

    const PTX: Ptx = ptx!("argmax");

    pub fn argmax(logits: &Tensor, ban: Option<&Tensor>) -> Result<Option<Tensor>> {
        let (b, v) = logits.dims2()?;
        let ban_ok = ban.is_none_or(|t| t.dtype() == logits.dtype() && t.elem_count() == v);
        if !logits.device().is_cuda() || !float_dtype(logits) || !ban_ok {
            return Ok(None);
        }
        let x = logits.contiguous()?;
        let ban = ban.map(|t| t.contiguous()).transpose()?;
        let Some(xs) = cuda(&x) else {
            return Ok(None);
        };
        let bs = match &ban {
            Some(t) => match cuda(t) {
                Some(g) => Some(g),
                None => return Ok(None),
            },
            None => None,
        };
        let dev = storage(&xs.0).device().clone();
        if v > ARGMAX_ONE_BLOCK {
            return argmax_split(&x, xs, bs.as_ref(), (b, v)).map(Some);
        }
        let func = kernel!(dev, PTX, "tb_argmax", x.dtype())?;
        let out = with_dtype!(x.dtype(), T => {
            let xv = view::<T>(storage(&xs.0), xs.1)?;
            let bv = bs.as_ref().map(|(s, l)| view::<T>(storage(s), l)).transpose()?;
            let early = Early::begin(&dev, b)?;
            let out = alloc::<u32>(&dev, b)?;
            let v_i = v as i32;
            let mut args = func.builder();
            args.arg(&xv);
            match &bv {
                Some(bv) => args.arg(bv),
                None => args.arg(&NULL),
            };
            args.arg(&out).arg(&v_i);
            let cfg = LaunchConfig {
                grid_dim: (b as u32, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            };
            early.launch()?;
            // SAFETY: x holds B·V elements, ban V, out B.
            unsafe { args.launch(cfg) }.w()?;
            wrap(out, &dev, (b, 1))
        });
        Ok(Some(out))
    }

    /// Rows longer than this are split over blocks (`tb_argmax_part`, then `tb_argmax_final`).
    const ARGMAX_ONE_BLOCK: usize = 16384;
    /// Columns a block of `tb_argmax_part`.
    const ARGMAX_CHUNK: usize = 2048;

    /// The greedy pick of long rows in two launches: each block the best of a chunk, then each
    /// row the best of its chunks.
    fn argmax_split(
        x: &Tensor,
        xs: (StorageRef<'_>, &Layout),
        ban: Option<&(StorageRef<'_>, &Layout)>,
        (b, v): (usize, usize),
    ) -> Result<Tensor> {
        let dev = storage(&xs.0).device().clone();
        let part = kernel!(dev, PTX, "tb_argmax_part", x.dtype())?;
        let fin = dev.get_or_load_custom_func("tb_argmax_final", PTX.module, PTX.text)?;
        let chunks = v.div_ceil(ARGMAX_CHUNK);
        let early = Early::begin(&dev, b)?;
        let (part_v, part_i) = (
            alloc::<f32>(&dev, b * chunks)?,
            alloc::<i32>(&dev, b * chunks)?,
        );
        let out = alloc::<u32>(&dev, b)?;
        with_dtype!(x.dtype(), T => {
            let xv = view::<T>(storage(&xs.0), xs.1)?;
            let bv = ban.map(|(s, l)| view::<T>(storage(s), l)).transpose()?;
            let (v_i, chunk_i) = (v as i32, ARGMAX_CHUNK as i32);
            let mut args = part.builder();
            args.arg(&xv);
            match &bv {
                Some(bv) => args.arg(bv),
                None => args.arg(&NULL),
            };
            args.arg(&part_v).arg(&part_i).arg(&v_i).arg(&chunk_i);
            let cfg = LaunchConfig {
                grid_dim: (chunks as u32, b as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            early.launch()?;
            // SAFETY: x holds B·V elements, ban V, the partials B·chunks.
            unsafe { args.launch(cfg) }.w()?;
        });
        let chunks_i = chunks as i32;
        let cfg = LaunchConfig {
            grid_dim: (b as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        Early::begin(&dev, b)?.launch()?;
        // SAFETY: the partials hold B·chunks values, out B.
        launch!(unsafe fin, cfg; &part_v, &part_i, &out, &chunks_i)?;
        Ok(wrap(out, &dev, (b, 1)))
    }
}
