//! NCCL's collectives (feature `nccl`): the sum on the device's stream as a candle custom op,
//! started on a stream of its own for sums that overlap the backward, ZeRO's reduce-scatter and
//! all-gather; and, where the ranks share a host, small sums through the one-shot kernel
//! ([`super::peer_sum`]).

use super::collective::{shard_len, AllReduce};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::CudaStream;
use candle_core::cuda::cudarc::nccl::safe::NcclType;
use candle_core::cuda::cudarc::nccl::{result, sys};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, InplaceOp1, Layout, Shape, Tensor};
use half::{bf16, f16};
use std::sync::Arc;

/// An NCCL communicator over one GPU per rank. A sum ([`AllReduce::all_reduce_sum`]) runs on
/// the GPU's candle stream, ordered with the kernels around it (tensor parallelism); a
/// started sum ([`AllReduce::start_sum`]) runs on a stream of its own, so that the backward
/// goes on while the gradients it has finished cross to the other ranks (data parallelism).
pub struct NcclAllReduce {
    comm: sys::ncclComm_t,
    /// candle's stream (the compute stream).
    compute: Arc<CudaStream>,
    /// The started sums' stream.
    side: Arc<CudaStream>,
    version: String,
    /// The one-shot sums' buffers, mapped between the ranks of one host
    /// ([`NcclAllReduce::map_peer_buffers`]): small sums skip NCCL.
    peer_sum: Option<crate::dist::peer_sum::PeerSum>,
    /// Device, rank and size where the ranks share a host (set by map_peer_buffers).
    host: Option<(candle_core::Device, usize, usize)>,
    /// Two ranks of one host: started sums as copy-engine copies, once prepared
    /// ([`AllReduce::prepare_started_sums`]).
    pair: std::sync::OnceLock<crate::dist::pair_sum::PairSum>,
}

// SAFETY: the raw communicator is used from one thread at a time (the model runs on the
// main thread); NCCL allows a communicator to be used from any thread as long as calls
// are not concurrent, and on several streams when every rank issues its calls in the
// same order (each rank runs the same program).
unsafe impl Send for NcclAllReduce {}
unsafe impl Sync for NcclAllReduce {}

impl Drop for NcclAllReduce {
    fn drop(&mut self) {
        // SAFETY: the communicator is ours, and nothing uses it after this.
        let _ = unsafe { result::comm_abort(self.comm) };
    }
}

fn nccl_err(e: result::NcclError) -> candle_core::Error {
    candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}"))
}

fn driver_err(e: candle_core::cuda::cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::Msg(format!("NCCL all-reduce's stream: {e:?}"))
}

impl NcclAllReduce {
    /// A new unique id (rank 0), as the bytes the rendezvous hands out.
    pub fn new_id() -> crate::error::Result<Vec<u8>> {
        let id = result::get_uniqueid().map_err(|e| {
            crate::error::Error::Unsupported(format!(
                "NCCL could not make a unique id ({e:?}): is libnccl.so.2 installed (bench env)?"
            ))
        })?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    /// Joins the communicator of `size` ranks named by `id` (blocks until all have joined).
    pub fn join(
        device: &candle_core::Device,
        rank: usize,
        size: usize,
        id: &[u8],
    ) -> crate::error::Result<Self> {
        let candle_core::Device::Cuda(dev) = device else {
            return Err(crate::error::Error::Unsupported(
                "NCCL needs a CUDA device".into(),
            ));
        };
        let mut nccl_id = sys::ncclUniqueId { internal: [0; 128] };
        for (d, s) in nccl_id.internal.iter_mut().zip(id) {
            *d = *s as core::ffi::c_char;
        }
        let compute = dev.cuda_stream();
        let side = compute.context().new_stream().map_err(|e| {
            crate::error::Error::Unsupported(format!("a second CUDA stream: {e:?}"))
        })?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: NCCL writes the communicator; the id is the one rank 0 made.
        unsafe {
            compute.context().bind_to_thread().map_err(|e| {
                crate::error::Error::Unsupported(format!("CUDA context: {e:?}"))
            })?;
            result::comm_init_rank(comm.as_mut_ptr(), size as i32, nccl_id, rank as i32)
        }
        .map_err(|e| {
            crate::error::Error::Unsupported(format!(
                "NCCL init failed on rank {rank} of {size} ({e:?}): run `bench env` on each host; NCCL_DEBUG=INFO shows why"
            ))
        })?;
        Ok(Self {
            // SAFETY: initialised by the successful call above.
            comm: unsafe { comm.assume_init() },
            compute,
            side,
            version: version(),
            peer_sum: None,
            host: None,
            pair: std::sync::OnceLock::new(),
        })
    }

    /// Maps the one-shot sums' buffers between the ranks (every rank calls it after
    /// [`NcclAllReduce::join`]); where some rank cannot, NCCL keeps every sum.
    pub fn map_peer_buffers(
        &mut self,
        device: &candle_core::Device,
        rank: usize,
        size: usize,
        same_host: bool,
    ) -> candle_core::Result<()> {
        if same_host {
            self.host = Some((device.clone(), rank, size));
        }
        if crate::kernels::enabled(crate::kernels::Fused::Oneshot) {
            let open = crate::dist::peer_sum::PeerSum::open;
            self.peer_sum = open(self, device, rank, size, same_host)?;
        }
        Ok(())
    }

    /// `count` values at `src` summed over the ranks into `dst` (may be `src`), on `stream`.
    fn sum<T: NcclType>(
        &self,
        src: u64,
        dst: u64,
        count: usize,
        stream: &CudaStream,
    ) -> candle_core::Result<()> {
        // SAFETY: `src` and `dst` hold `count` values of T on this rank's device, alive
        // until `stream` has run the collective (the callers keep them).
        unsafe {
            result::all_reduce(
                src as *const _,
                dst as *mut _,
                count,
                T::as_nccl_type(),
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(nccl_err)
    }

    /// `count` values of `dtype` at `src` summed into `dst` on `stream`.
    fn sum_dtype(
        &self,
        dtype: DType,
        src: u64,
        dst: u64,
        count: usize,
        stream: &CudaStream,
    ) -> candle_core::Result<()> {
        match dtype {
            DType::F32 => self.sum::<f32>(src, dst, count, stream),
            DType::BF16 => self.sum::<bf16>(src, dst, count, stream),
            DType::F16 => self.sum::<f16>(src, dst, count, stream),
            other => candle_core::bail!("NCCL all-reduce of {other:?}"),
        }
    }

    /// ZeRO's collectives on the compute stream: `scatter`, the sum of `src` (ranks·count)
    /// with this rank's run of `count` into `dst`; else `src`'s `count` values of every
    /// rank into `dst` (ranks·count), in rank order.
    fn scatter_or_gather(
        &self,
        dtype: DType,
        src: u64,
        dst: u64,
        count: usize,
        scatter: bool,
    ) -> candle_core::Result<()> {
        let nccl_type = match dtype {
            DType::F32 => f32::as_nccl_type(),
            DType::BF16 => bf16::as_nccl_type(),
            DType::F16 => f16::as_nccl_type(),
            other => candle_core::bail!("NCCL collective of {other:?}"),
        };
        let stream = self.compute.cu_stream() as _;
        // SAFETY: `src` and `dst` hold the counts above on this rank's device, alive until
        // the compute stream has run the collective (the caller's tensors).
        unsafe {
            match scatter {
                true => result::reduce_scatter(
                    src as *const _,
                    dst as *mut _,
                    count,
                    nccl_type,
                    sys::ncclRedOp_t::ncclSum,
                    self.comm,
                    stream,
                ),
                false => result::all_gather(
                    src as *const _,
                    dst as *mut _,
                    count,
                    nccl_type,
                    self.comm,
                    stream,
                ),
            }
        }
        .map(|_| ())
        .map_err(nccl_err)
    }
}

/// The device address of `s`'s buffer (event tracking is off on these devices: taking it
/// records nothing on `stream`).
fn address(s: &CudaStorage, stream: &CudaStream) -> candle_core::Result<u64> {
    use candle_core::cuda::cudarc::driver::DevicePtr;
    Ok(match s.dtype() {
        DType::F32 => s.as_cuda_slice::<f32>()?.device_ptr(stream).0,
        DType::BF16 => s.as_cuda_slice::<bf16>()?.device_ptr(stream).0,
        DType::F16 => s.as_cuda_slice::<f16>()?.device_ptr(stream).0,
        other => candle_core::bail!("NCCL all-reduce of {other:?}"),
    })
}

/// NCCL's version (`ncclGetVersion`: major·10000 + minor·100 + patch since 2.9).
fn version() -> String {
    match result::get_nccl_version() {
        Ok(v) => crate::env::nccl_version(v),
        Err(_) => "unknown".into(),
    }
}

/// Which collective [`IntoNew`] runs: the sum, or ZeRO's reduce-scatter / all-gather over
/// this many ranks.
#[derive(Clone, Copy)]
enum Collective {
    Sum,
    ReduceScatter(usize),
    AllGather(usize),
}

/// A collective into a new tensor, on the compute stream.
struct IntoNew<'a>(&'a NcclAllReduce, Collective);

impl CustomOp1 for IntoNew<'_> {
    fn name(&self) -> &'static str {
        match self.1 {
            Collective::Sum => "nccl-all-reduce",
            Collective::ReduceScatter(_) => "nccl-reduce-scatter",
            Collective::AllGather(_) => "nccl-all-gather",
        }
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("NCCL collective of a CPU tensor")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("NCCL collectives need a contiguous tensor")
        };
        let dev = s.device().clone();
        let (n, size) = (end - start, s.dtype().size_in_bytes());
        let out_len = match self.1 {
            Collective::Sum => n,
            Collective::ReduceScatter(ranks) => n / ranks,
            Collective::AllGather(ranks) => n * ranks,
        };
        let src = address(s, &self.0.compute)? + (start * size) as u64;
        macro_rules! alloc {
            ($t:ty) => {{
                // SAFETY: every element is written by the collective before it is read.
                CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<$t>(out_len)? }, dev.clone())
            }};
        }
        let out = match s.dtype() {
            DType::F32 => alloc!(f32),
            DType::BF16 => alloc!(bf16),
            DType::F16 => alloc!(f16),
            other => candle_core::bail!("NCCL collective of {other:?}"),
        };
        let dst = address(&out, &self.0.compute)?;
        let nccl = self.0;
        match self.1 {
            Collective::Sum => nccl.sum_dtype(s.dtype(), src, dst, n, &nccl.compute)?,
            Collective::ReduceScatter(_) => {
                nccl.scatter_or_gather(s.dtype(), src, dst, out_len, true)?
            }
            Collective::AllGather(_) => nccl.scatter_or_gather(s.dtype(), src, dst, n, false)?,
        }
        // The sum keeps the input's shape; ZeRO's reduce-scatter and all-gather are flat.
        let shape = match self.1 {
            Collective::Sum => l.shape().clone(),
            _ => Shape::from(out_len),
        };
        Ok((out, shape))
    }
}

/// The sum written over the tensor, on the side stream after the compute stream's work so
/// far.
struct SumInPlace<'a>(&'a NcclAllReduce);

impl InplaceOp1 for SumInPlace<'_> {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-in-place"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("NCCL all-reduce of a CPU tensor")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("NCCL all-reduce needs a contiguous tensor")
        };
        let nccl = self.0;
        let at = address(s, &nccl.side)? + (start * s.dtype().size_in_bytes()) as u64;
        nccl.side.join(&nccl.compute).map_err(driver_err)?;
        nccl.sum_dtype(s.dtype(), at, at, end - start, &nccl.side)
    }
}

impl AllReduce for NcclAllReduce {
    fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = x.contiguous()?;
        if let Some(peers) = &self.peer_sum {
            if let Some(sum) = crate::kernels::oneshot_sum(&x, peers.buffers())? {
                return Ok(sum);
            }
        }
        x.apply_op1_no_bwd(&IntoNew(self, Collective::Sum))
    }

    fn reduce_scatter_sum(&self, x: &Tensor, _: usize, size: usize) -> candle_core::Result<Tensor> {
        shard_len(x, size)?;
        x.contiguous()?
            .apply_op1_no_bwd(&IntoNew(self, Collective::ReduceScatter(size)))
    }

    fn all_gather(&self, x: &Tensor, _: usize, size: usize) -> candle_core::Result<Tensor> {
        x.flatten_all()?
            .contiguous()?
            .apply_op1_no_bwd(&IntoNew(self, Collective::AllGather(size)))
    }

    fn sum_add_layer_norm(
        &self,
        x: &Tensor,
        r: &Tensor,
        w: &Tensor,
        b: &Tensor,
        eps: f64,
    ) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        match &self.peer_sum {
            Some(peers) => crate::kernels::oneshot_add_layer_norm(x, r, w, b, eps, peers.buffers()),
            None => Ok(None),
        }
    }

    fn gemv_sum_add_layer_norm(
        &self,
        gemv: &crate::kernels::PendingGemv,
        r: &Tensor,
        norm: (&Tensor, &Tensor, f64),
    ) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        match &self.peer_sum {
            Some(peers) => {
                crate::kernels::gemv_oneshot_add_layer_norm(gemv, r, norm, peers.buffers())
            }
            None => Ok(None),
        }
    }

    fn start_sum(&self, x: Tensor) -> candle_core::Result<Tensor> {
        let x = x.contiguous()?;
        if let Some(pair) = self.pair.get() {
            if pair.start(&x, &self.compute, &self.side)? {
                return Ok(x);
            }
        }
        x.inplace_op1(&SumInPlace(self))?;
        Ok(x)
    }

    fn wait_sums(&self) -> candle_core::Result<()> {
        if let Some(pair) = self.pair.get() {
            pair.finish(&self.compute, &self.side)?;
        }
        self.compute.join(&self.side).map_err(driver_err)
    }

    fn prepare_started_sums(&self, bytes: usize) -> candle_core::Result<()> {
        let Some((device, rank, 2)) = &self.host else {
            return Ok(());
        };
        if !crate::kernels::enabled(crate::kernels::Fused::CopySum) || self.pair.get().is_some() {
            return Ok(());
        }
        if let Some(pair) = crate::dist::pair_sum::PairSum::open(self, device, *rank, bytes)? {
            if *rank == 0 {
                let mib = bytes as f64 / (1 << 20) as f64;
                eprintln!("note: the started gradient sums cross over NVLink as copy-engine sums ({mib:.0} MiB a rank)");
            }
            let _ = self.pair.set(pair);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let mut how = format!("nccl {}", self.version);
        if self.peer_sum.is_some() && crate::kernels::enabled(crate::kernels::Fused::Oneshot) {
            how += " + one-shot sums";
        }
        if self.pair.get().is_some() {
            how += " + copy-engine sums";
        }
        how
    }

    fn on_device(&self) -> bool {
        true
    }
}
