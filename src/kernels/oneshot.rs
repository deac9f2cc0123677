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

/// (r + Σ x, LayerNorm(r + Σ x)) over the last dim in one launch: the sum over the ranks of
/// `peers` of a row-parallel projection's partial output x (…, C), the residual r (…, C) and
/// the next norm's w, b (C,); bit for bit the one-shot sum followed by
/// [`super::add_layer_norm`]`(r, sum)`. None where either would not apply (then the caller
/// sums, adds and norms in turn).
pub fn oneshot_add_layer_norm(
    x: &Tensor,
    r: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    peers: &PeerBuffers,
) -> Result<Option<(Tensor, Tensor)>> {
    if ![Fused::SumNorm, Fused::Oneshot, Fused::Decode]
        .into_iter()
        .all(enabled)
    {
        return Ok(None);
    }
    imp::oneshot_add_layer_norm(x, r, w, b, eps, peers)
}

/// A row-parallel projection's decode GEMV before it runs: x (M, K), w (N, K) (nn.Linear's
/// layout), bias (N,); its output (M, N) is this rank's share of a sum.
pub struct PendingGemv<'a> {
    pub x: &'a Tensor,
    pub w: &'a Tensor,
    pub bias: &'a Tensor,
}

/// [`oneshot_add_layer_norm`] of the GEMV's output x Wᵀ + b (M ≤ 4 rows), the GEMV pushing
/// its output into the buffers as it makes it (`--fused push-sum`): two launches, the same
/// bits as [`super::gemv`] followed by [`oneshot_add_layer_norm`]. r (…, N) holds M·N values.
/// None where the three would not all apply (nothing launched: the caller runs the GEMV).
pub fn gemv_oneshot_add_layer_norm(
    gemv: &PendingGemv,
    r: &Tensor,
    (w, b, eps): (&Tensor, &Tensor, f64),
    peers: &PeerBuffers,
) -> Result<Option<(Tensor, Tensor)>> {
    let paths = [Fused::PushSum, Fused::Gemv, Fused::SumNorm, Fused::Oneshot];
    if !paths.into_iter().chain([Fused::Decode]).all(enabled) {
        return Ok(None);
    }
    imp::gemv_oneshot_add_layer_norm(gemv, r, (w, b, eps), peers)
}

/// x += the `n = x.elem_count()` values at device address `recv` (a pair region the other GPU
/// wrote: src/dist/pair_sum.rs), in place on x's stream; x contiguous on a GPU.
#[cfg(feature = "cuda")]
pub fn pair_add_in_place(x: &Tensor, recv: u64) -> Result<()> {
    x.inplace_op1(&imp::PairAdd(recv))
}

/// Queues on `dev`'s stream a wait until the u32 at `flag` (this GPU's, written by the other)
/// reaches `epoch`.
#[cfg(feature = "cuda")]
pub fn pair_wait(dev: &candle_core::CudaDevice, flag: u64, epoch: u32) -> Result<()> {
    imp::pair_flag(dev, "tb_pair_wait", flag, epoch)
}

/// Queues on `dev`'s stream, after its earlier work, the write of `epoch` to the u32 at `flag`
/// (the other GPU's).
#[cfg(feature = "cuda")]
pub fn pair_signal(dev: &candle_core::CudaDevice, flag: u64, epoch: u32) -> Result<()> {
    imp::pair_flag(dev, "tb_pair_signal", flag, epoch)
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{PeerBuffers, PendingGemv};
    use candle_core::{Result, Tensor};

    pub fn gemv_oneshot_add_layer_norm(
        _: &PendingGemv,
        _: &Tensor,
        _: (&Tensor, &Tensor, f64),
        _: &PeerBuffers,
    ) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }

    pub fn oneshot_sum(_: &Tensor, _: &PeerBuffers) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn oneshot_add_layer_norm(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: &PeerBuffers,
    ) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{PeerBuffers, PendingGemv, ONESHOT_CAP};
    use crate::kernels::launch::{
        aligned16, alloc, cuda, flat_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, storage,
        view, with_dtype, wrap, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("oneshot");
    /// gemv.cuh's COLS and SPLIT: output columns a block of the pushing GEMV, warps a column.
    const GEMV_COLS: usize = 2;
    const GEMV_WARPS_PER_COL: u32 = 4;
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
            let cfg = grid(THREADS);
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

    /// Every kernel of oneshot.cu runs MAX_BLOCKS blocks, whatever the size, so that every
    /// block's epoch counter moves with every kernel (oneshot.cu says why that matters).
    fn grid(threads: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (MAX_BLOCKS as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// x summed over the ranks, added to r, and normed: (rows, c) each.
    struct SumAddNorm<'a> {
        peers: &'a PeerBuffers,
        eps: f32,
        /// Every rank's x is in the buffers already (a pushing GEMV ran): receive only.
        pushed: bool,
    }

    impl SumAddNorm<'_> {
        /// (s, y) of partial x, residual r, weight w and bias b (contiguous, on one device).
        fn launch(
            &self,
            x: &Tensor,
            r: &Tensor,
            w: &Tensor,
            b: &Tensor,
        ) -> Result<(Tensor, Tensor)> {
            let c = x.dim(candle_core::D::Minus1)?;
            let rows = x.elem_count() / c;
            let (Some(xs), Some(rs), Some(ws), Some(bs)) = (cuda(x), cuda(r), cuda(w), cuda(b))
            else {
                candle_core::bail!("one-shot add + norm: a tensor not on the GPU")
            };
            let dev = storage(&xs.0).device().clone();
            let func = kernel!(dev, PTX, "tb_oneshot_add_layer_norm", x.dtype())?;
            let vecs = c / (16 / x.dtype().size_in_bytes());
            // The block size of add_layer_norm's vector path, so its reductions add alike.
            let cfg = grid(vecs.next_multiple_of(32));
            let (table, rank, world) = (
                self.peers.table,
                self.peers.rank as u32,
                self.peers.world as u32,
            );
            let (rows_i, c_i, cap) = (rows as i32, c as i32, ONESHOT_CAP as u32);
            let pushed = self.pushed as i32;
            Ok(with_dtype!(x.dtype(), T => {
                let xv = view::<T>(storage(&xs.0), xs.1)?;
                let rv = view::<T>(storage(&rs.0), rs.1)?;
                let wv = view::<T>(storage(&ws.0), ws.1)?;
                let bv = view::<T>(storage(&bs.0), bs.1)?;
                let (s, y) = (alloc::<T>(&dev, rows * c)?, alloc::<T>(&dev, rows * c)?);
                // SAFETY: x, r, s and y hold rows·c elements, w and b c, from 16-byte
                // boundaries, c / vecs elements a vector, ≤ 1024 vectors a row, at most
                // ONESHOT_CAP bytes (checked by oneshot_add_layer_norm); `table` holds every
                // rank's buffer of PeerBuffers::buffer_bytes(), mapped into this process.
                launch!(unsafe func, cfg; &xv, &rv, &wv, &bv, &s, &y, &rows_i, &c_i, &self.eps,
                        &table, &rank, &world, &cap, &pushed)?;
                (wrap(s, &dev, x.shape()), wrap(y, &dev, x.shape()))
            }))
        }
    }

    pub fn oneshot_add_layer_norm(
        x: &Tensor,
        r: &Tensor,
        w: &Tensor,
        b: &Tensor,
        eps: f64,
        peers: &PeerBuffers,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let c = x.dim(candle_core::D::Minus1)?;
        let bytes = x.elem_count() * x.dtype().size_in_bytes();
        let fits = norm_fits(x.dtype(), c, bytes, [r, w, b]) && r.shape() == x.shape();
        if !x.device().is_cuda() || !float_dtype(x) || !fits {
            return Ok(None);
        }
        let (x, r) = (x.contiguous()?, r.contiguous()?);
        let (w, b) = (w.contiguous()?, b.contiguous()?);
        if ![&x, &r, &w, &b].into_iter().all(aligned16) {
            return Ok(None);
        }
        let op = SumAddNorm {
            peers,
            eps: eps as f32,
            pushed: false,
        };
        Ok(Some(op.launch(&x, &r, &w, &b)?))
    }

    /// Whether the sum + add + norm kernel takes a sum (…, c) of `bytes` against r, w, b.
    fn norm_fits(x_dtype: DType, c: usize, bytes: usize, [r, w, b]: [&Tensor; 3]) -> bool {
        let n = 16 / x_dtype.size_in_bytes();
        let same = [r, w, b].iter().all(|t| t.dtype() == x_dtype);
        let fits = bytes > 0 && bytes <= ONESHOT_CAP && c.is_multiple_of(n) && c / n <= 1024;
        same && fits && w.dims() == [c] && b.dims() == [c]
    }

    pub fn gemv_oneshot_add_layer_norm(
        g: &PendingGemv,
        r: &Tensor,
        (w, b, eps): (&Tensor, &Tensor, f64),
        peers: &PeerBuffers,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let (x, dt) = (g.x, g.x.dtype());
        let half = matches!(dt, DType::BF16 | DType::F16);
        if !x.device().is_cuda() || !half || x.rank() != 2 || g.w.rank() != 2 {
            return Ok(None);
        }
        let ((m, k), (n, wk)) = (x.dims2()?, g.w.dims2()?);
        let gemv_fits = (1..=crate::kernels::gemv::MAX_ROWS).contains(&m) && wk == k;
        let whole = (k * dt.size_in_bytes()).is_multiple_of(16) && n.is_multiple_of(2);
        let same = g.w.dtype() == dt && g.bias.dtype() == dt && g.bias.dims() == [n];
        let laid = [x, g.w, g.bias, r, w, b].iter().all(|t| t.is_contiguous());
        let aligned = [x, g.w, r, w, b].into_iter().all(aligned16);
        let bytes = m * n * dt.size_in_bytes();
        // The receiver takes its rows and width from r: (…, n) holding the m rows.
        let r_fits = r.elem_count() == m * n && r.dim(candle_core::D::Minus1)? == n;
        let norm = norm_fits(dt, n, bytes, [r, w, b]) && r_fits;
        // Inference only: this GEMV has no backward (as kernels::linear refuses tracked ops).
        let inference = ![x, g.w, g.bias].iter().any(|t| t.track_op());
        if !(gemv_fits && whole && same && laid && aligned && norm && inference) {
            return Ok(None);
        }
        push_gemv(g, peers)?;
        let op = SumAddNorm {
            peers,
            eps: eps as f32,
            pushed: true,
        };
        // The receiver reads only the buffers; r stands in for x, with r's shape.
        Ok(Some(op.launch(r, r, w, b)?))
    }

    /// Launches the pushing GEMV of `g` (checked by the caller).
    fn push_gemv(g: &PendingGemv, peers: &PeerBuffers) -> Result<()> {
        let (Some(xs), Some(ws), Some(bs)) = (cuda(g.x), cuda(g.w), cuda(g.bias)) else {
            candle_core::bail!("pushing GEMV: a tensor not on the GPU")
        };
        let dev = storage(&xs.0).device().clone();
        let ((m, k), n) = (g.x.dims2()?, g.w.dim(0)?);
        let func = match m {
            1 => kernel!(dev, PTX, "tb_gemv_push1", g.x.dtype())?,
            2 => kernel!(dev, PTX, "tb_gemv_push2", g.x.dtype())?,
            3 => kernel!(dev, PTX, "tb_gemv_push3", g.x.dtype())?,
            _ => kernel!(dev, PTX, "tb_gemv_push4", g.x.dtype())?,
        };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_COLS) as u32, 1, 1),
            block_dim: (32 * GEMV_WARPS_PER_COL * GEMV_COLS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let kv = (k * g.x.dtype().size_in_bytes() / 16) as i32;
        let (table, rank, world) = (peers.table, peers.rank as u32, peers.world as u32);
        let (n_i, cap) = (n as i32, ONESHOT_CAP as u32);
        with_dtype!(g.x.dtype(), T => {
            let xv = view::<T>(storage(&xs.0), xs.1)?;
            let wv = view::<T>(storage(&ws.0), ws.1)?;
            let bv = view::<T>(storage(&bs.0), bs.1)?;
            // SAFETY: x holds m·k, W n·k and b n elements, contiguous from 16-byte boundaries
            // in whole vectors, m ≤ 4, n even, m·n values within ONESHOT_CAP bytes (checked by
            // gemv_oneshot_add_layer_norm); `table` holds every rank's buffer of
            // PeerBuffers::buffer_bytes(), mapped into this process.
            launch!(unsafe func, cfg; &xv, &wv, &bv, &n_i, &kv, &table, &rank, &world, &cap)?;
            Ok(())
        })
    }

    /// One thread of the flag kernel `name` (tb_pair_wait or tb_pair_signal).
    pub fn pair_flag(
        dev: &candle_core::CudaDevice,
        name: &str,
        flag: u64,
        epoch: u32,
    ) -> Result<()> {
        let func = dev.get_or_load_custom_func(name, PTX.module, PTX.text)?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `flag` is a u32 in a live pair region (this GPU's or the other's, mapped).
        launch!(unsafe func, cfg; &flag, &epoch)?;
        Ok(())
    }

    /// x += recv, in place.
    pub struct PairAdd(pub u64);

    impl candle_core::InplaceOp1 for PairAdd {
        fn name(&self) -> &'static str {
            "tb-pair-add"
        }

        fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> Result<()> {
            candle_core::bail!("tb-pair-add runs on GPUs")
        }

        fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
            let Some((start, end)) = l.contiguous_offsets() else {
                candle_core::bail!("tb-pair-add needs a contiguous tensor")
            };
            let dev = s.device().clone();
            let func = kernel!(dev, PTX, "tb_pair_add", s.dtype())?;
            let n = (end - start) as i64;
            with_dtype!(s.dtype(), T => {
                let mut x = T::as_cuda_slice_mut(s)?.slice_mut(start..end);
                // SAFETY: x holds n elements; `self.0` holds n of the same type (the pair
                // region the caller sized for every started sum of a step).
                launch!(unsafe func, flat_config(end - start); &mut x, &self.0, &n)?;
                Ok(())
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
