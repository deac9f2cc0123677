//! The one-shot sum over the GPUs of one host (`--fused oneshot`; kernel in oneshot.cu): every
//! rank pushes its values into every rank's buffer over NVLink and sums what it received, one
//! launch instead of NCCL's all-reduce for the small sums of tensor-parallel decoding. The
//! buffers are mapped between the ranks by src/dist/peer_sum.rs. Shapes: x any, the sum the
//! same.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// Ranks a one-shot sum spans at most (oneshot.cu's MAX_RANKS).
pub const ONESHOT_MAX_RANKS: usize = 8;
/// The largest sum in bytes a one-shot sum takes; larger ones go to NCCL (one-shot sums pay
/// off under ≈ 512 KiB on NVLink pairs: vLLM's and TensorRT-LLM's thresholds).
pub const ONESHOT_CAP: usize = 512 * 1024;
/// Bytes of counters before the data slots (oneshot.cu's DATA).
const HEADER_BYTES: usize = 4096;

/// Where every rank's buffer is, as this process maps it.
#[derive(Clone, Copy, Debug)]
pub struct PeerBuffers {
    /// Device address of `u64[ONESHOT_MAX_RANKS]`: rank r's buffer.
    pub table: u64,
    pub rank: usize,
    pub world: usize,
}

impl PeerBuffers {
    /// The bytes one rank's buffer holds (all of them start zeroed): counters, two slots of
    /// a run for each possible sender, a run being the sum's largest size twice over (each
    /// 16-byte line carries 8 bytes of values and the epoch twice).
    pub const fn buffer_bytes() -> usize {
        HEADER_BYTES + 2 * ONESHOT_MAX_RANKS * 2 * ONESHOT_CAP
    }
}

/// The sum of `x` over the ranks of `peers`, every rank calling with the same shape and dtype
/// in the same order. None where it does not apply (CPU, switched off, a dtype other than
/// f32 / bf16 / f16, not whole 16-byte vectors, over [`ONESHOT_CAP`]): NCCL's all-reduce then.
pub fn oneshot_sum(x: &Tensor, peers: &PeerBuffers) -> Result<Option<Tensor>> {
    if !enabled(Fused::Oneshot) {
        return Ok(None);
    }
    imp::oneshot_sum(x, peers)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::PeerBuffers;
    use candle_core::{Result, Tensor};

    pub fn oneshot_sum(_: &Tensor, _: &PeerBuffers) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{PeerBuffers, ONESHOT_CAP};
    use crate::kernels::launch::{
        aligned16, alloc, float_dtype, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::{CudaStorage, CustomOp1, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("oneshot");
    /// oneshot.cu's MAX_BLOCKS: each block of the grid has its own flags.
    const MAX_BLOCKS: usize = 32;
    const THREADS: usize = 256;

    struct Sum<'a>(&'a PeerBuffers);

    impl CustomOp1 for Sum<'_> {
        fn name(&self) -> &'static str {
            "tb-oneshot-sum"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = s.device().clone();
            let n = l.shape().elem_count();
            let lines = (n * s.dtype().size_in_bytes() / 8) as i64; // 8 bytes of values a line
                                                                    // The grid depends only on the size, so it is the same on every rank.
            let cfg = LaunchConfig {
                grid_dim: (
                    (lines as usize).div_ceil(THREADS).clamp(1, MAX_BLOCKS) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (table, rank, world) = (self.0.table, self.0.rank as u32, self.0.world as u32);
            let cap = ONESHOT_CAP as u32;
            let func = kernel!(dev, PTX, "tb_oneshot_sum", s.dtype())?;
            with_dtype!(s.dtype(), T => {
                let x = view::<T>(s, l)?;
                let out = alloc::<T>(&dev, n)?;
                // SAFETY: x and out hold n elements, whole 16-byte vectors from aligned starts,
                // at most ONESHOT_CAP bytes (checked by oneshot_sum); `table` holds every rank's
                // buffer of PeerBuffers::buffer_bytes(), mapped into this process.
                launch!(unsafe func, cfg; &x, &out, &lines, &table, &rank, &world, &cap)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), l.shape().clone()))
            })
        }
    }

    pub fn oneshot_sum(x: &Tensor, peers: &PeerBuffers) -> Result<Option<Tensor>> {
        let bytes = x.elem_count() * x.dtype().size_in_bytes();
        let fits = bytes > 0 && bytes.is_multiple_of(16) && bytes <= ONESHOT_CAP;
        if !x.device().is_cuda() || !float_dtype(x) || !fits || !aligned16(x) {
            return Ok(None);
        }
        Ok(Some(x.apply_op1_no_bwd(&Sum(peers))?))
    }
}
