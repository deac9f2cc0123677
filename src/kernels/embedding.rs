//! The token embedding's gradient as one scatter-add kernel (`--fused embedding`; kernel in
//! embedding.cu) instead of candle's `index_add`, which walked the rows one at a time.
//!
//! Shapes: N tokens, C channels, V vocabulary. ids (N,) u32; demb (N, C) f32; the gradient it
//! adds to (V, C) f32.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// `dst` plus each row of `demb` added at row `ids[i]`: candle's `dst.index_add(ids, demb, 0)`
/// for f32 on CUDA (the sum of a repeated id's rows in no fixed order). None elsewhere.
pub fn embedding_bwd(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Embedding) {
        return Ok(None);
    }
    imp::embedding_bwd(dst, ids, demb)
}

/// The CPU runs candle's index_add.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn embedding_bwd(_: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::launch::{alloc, kernel, launch, no_cpu_fwd, ptx, view, Ptx};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{bail, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("embedding");

    /// out = dst, then out[ids[i]] += demb[i].
    struct EmbeddingBwd;

    impl CustomOp3 for EmbeddingBwd {
        fn name(&self) -> &'static str {
            "tb-embedding-bwd"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            dst: &CudaStorage,
            dl: &Layout,
            ids: &CudaStorage,
            il: &Layout,
            demb: &CudaStorage,
            el: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = dst.device().clone();
            let (vocab, c) = dl.shape().dims2()?;
            let (rows, ec) = el.shape().dims2()?;
            if ec != c || il.shape().elem_count() != rows {
                bail!(
                    "embedding backward: ids {:?}, rows {:?}, gradient {:?}",
                    il.shape(),
                    el.shape(),
                    dl.shape()
                );
            }
            let (dv, iv, ev) = (
                view::<f32>(dst, dl)?,
                view::<u32>(ids, il)?,
                view::<f32>(demb, el)?,
            );
            let mut out = alloc::<f32>(&dev, vocab * c)?;
            dev.memcpy_dtod(&dv.slice(..vocab * c), &mut out)?;
            let func = kernel!(dev, PTX, "tb_embedding_bwd")?;
            let cfg = LaunchConfig {
                grid_dim: (rows.clamp(1, 65535) as u32, 1, 1),
                block_dim: (c.next_power_of_two().clamp(32, 256) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (rows_i, c_i, vocab_i) = (rows as i64, c as i32, vocab as i64);
            // SAFETY: ids holds rows ids, demb rows·c elements, out vocab·c; ids ≥ vocab are
            // skipped by the kernel.
            launch!(unsafe func, cfg; &iv, &ev, &out, &rows_i, &c_i, &vocab_i)?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), dl.shape().clone()))
        }
    }

    pub fn embedding_bwd(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> Result<Option<Tensor>> {
        let f32s = dst.dtype() == DType::F32 && demb.dtype() == DType::F32;
        if !dst.device().is_cuda() || !f32s || ids.dtype() != DType::U32 || dst.rank() != 2 {
            return Ok(None);
        }
        let (dst, ids, demb) = (dst.contiguous()?, ids.contiguous()?, demb.contiguous()?);
        Ok(Some(dst.apply_op3_no_bwd(&ids, &demb, &EmbeddingBwd)?))
    }
}
