//! The collectives of parallel runs: a sum over ranks of a tensor every rank holds with the
//! same shape (Megatron's all-reduce after a row-parallel projection, data parallelism's
//! gradient sum), and ZeRO-2/3's reduce-scatter and all-gather of flat shards.
//!
//! - [`TcpAllReduce`]: tensors through rank 0 over TCP, for CPU ranks (tests, CI, laptops).
//!   Rank 0 sums in rank order, so every rank gets the same bits.
//! - `NcclAllReduce` (feature `nccl`): NCCL on the device's stream, as a candle custom op, or
//!   started on a second stream for sums that overlap the backward (data parallelism).

use candle_core::{DType, Tensor};
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Sum over the ranks of a group.
pub trait AllReduce: Send + Sync {
    /// Every rank calls this with a tensor of the same shape and dtype, in the same order; each
    /// gets the element-wise sum.
    fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor>;
    /// Starts the same sum for `x`, which the caller owns and keeps: the result holds it
    /// once [`AllReduce::wait_sums`] has been called, and is read only after that. NCCL sums
    /// in place on a stream of its own, under the work queued after it; the default sums now.
    fn start_sum(&self, x: Tensor) -> candle_core::Result<Tensor> {
        self.all_reduce_sum(&x)
    }
    /// Orders what is queued next after every started sum.
    fn wait_sums(&self) -> candle_core::Result<()> {
        Ok(())
    }
    /// The sum over the ranks of `x` (size·S,), of which rank `rank` gets its run (S,):
    /// values rank·S .. (rank+1)·S. The default sums everything and keeps the run.
    fn reduce_scatter_sum(
        &self,
        x: &Tensor,
        rank: usize,
        size: usize,
    ) -> candle_core::Result<Tensor> {
        let s = shard_len(x, size)?;
        self.all_reduce_sum(x)?.narrow(0, rank * s, s)
    }
    /// Every rank's `x` (S,), in rank order: (size·S,). The default sums zeros around each
    /// rank's run (exact: every other value added is zero).
    fn all_gather(&self, x: &Tensor, rank: usize, size: usize) -> candle_core::Result<Tensor> {
        let s = x.elem_count();
        let before = Tensor::zeros(rank * s, x.dtype(), x.device())?;
        let after = Tensor::zeros((size - rank - 1) * s, x.dtype(), x.device())?;
        self.all_reduce_sum(&Tensor::cat(&[&before, &x.flatten_all()?, &after], 0)?)
    }
    /// `tcp` or `nccl X.Y.Z`, for the log header.
    fn describe(&self) -> String;
    /// Whether the sum runs on the device's stream without the host (a CUDA graph can then
    /// record it).
    fn on_device(&self) -> bool {
        false
    }
}

/// S of a reduce-scatter of `x` (size·S,) over `size` ranks.
fn shard_len(x: &Tensor, size: usize) -> candle_core::Result<usize> {
    let n = x.elem_count();
    if x.rank() != 1 || !n.is_multiple_of(size) {
        candle_core::bail!(
            "reduce-scatter of {:?} over {size} ranks: a flat multiple of the ranks",
            x.shape()
        )
    }
    Ok(n / size)
}

/// Units `rank` holds when `n` units (heads, hidden units) are split over `size` ranks:
/// contiguous, sizes differing by at most one (GPT-2 XL's 25 heads on 2 ranks: 12 and 13).
pub fn part(n: usize, rank: usize, size: usize) -> Range<usize> {
    rank * n / size..(rank + 1) * n / size
}

/// This rank's place in a tensor-parallel group, and how it sums partial outputs.
#[derive(Clone)]
pub struct Tp {
    pub rank: usize,
    pub size: usize,
    /// None when `size == 1`.
    pub reduce: Option<Arc<dyn AllReduce>>,
}

impl Tp {
    /// No tensor parallelism.
    pub fn single() -> Self {
        Self {
            rank: 0,
            size: 1,
            reduce: None,
        }
    }

    /// This rank's share of `n` units.
    pub fn part(&self, n: usize) -> Range<usize> {
        part(n, self.rank, self.size)
    }
}

/// Star all-reduce over TCP: each rank sends its f32 values to rank 0, which adds them in rank
/// order and sends the sum back. Slow (host copies) and meant for CPU ranks.
pub struct TcpAllReduce {
    rank: usize,
    /// Rank 0: a connection to each other rank, in rank order. Others: the one to rank 0.
    links: Mutex<Vec<(BufReader<TcpStream>, BufWriter<TcpStream>)>>,
}

fn io_err(what: &str, e: std::io::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("tcp all-reduce: {what}: {e}"))
}

impl TcpAllReduce {
    /// Rank 0's listening socket on `ip` (the rendezvous address, so other hosts can reach it);
    /// its address is what the other ranks need, handed out by the rendezvous.
    pub fn listen(ip: std::net::IpAddr) -> std::io::Result<TcpListener> {
        TcpListener::bind(SocketAddr::new(ip, 0))
    }

    /// Rank 0: waits (up to `timeout`) for the `size - 1` other ranks.
    pub fn serve(listener: TcpListener, size: usize, timeout: Duration) -> std::io::Result<Self> {
        let deadline = Instant::now() + timeout;
        listener.set_nonblocking(true)?;
        let mut by_rank: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        let mut joined = 0;
        while joined + 1 < size {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    let mut rank = [0u8; 8];
                    (&s).read_exact(&mut rank)?;
                    let r = u64::from_le_bytes(rank) as usize;
                    if r == 0 || r >= size || by_rank[r].is_some() {
                        return Err(std::io::Error::other(format!(
                            "a peer says it is rank {r} of {size}"
                        )));
                    }
                    by_rank[r] = Some(s);
                    joined += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "not every rank connected",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        }
        let links = by_rank
            .into_iter()
            .flatten()
            .map(|s| Ok((BufReader::new(s.try_clone()?), BufWriter::new(s))))
            .collect::<std::io::Result<_>>()?;
        Ok(Self {
            rank: 0,
            links: Mutex::new(links),
        })
    }

    /// Rank `rank` > 0: connects to rank 0's collective socket at `addr`.
    pub fn connect(addr: SocketAddr, rank: usize) -> std::io::Result<Self> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        (&s).write_all(&(rank as u64).to_le_bytes())?;
        Ok(Self {
            rank,
            links: Mutex::new(vec![(BufReader::new(s.try_clone()?), BufWriter::new(s))]),
        })
    }
}

fn send(w: &mut BufWriter<TcpStream>, v: &[f32]) -> std::io::Result<()> {
    w.write_all(&(v.len() as u64).to_le_bytes())?;
    for x in v {
        w.write_all(&x.to_le_bytes())?;
    }
    w.flush()
}

fn recv(r: &mut BufReader<TcpStream>, n: usize) -> std::io::Result<Vec<f32>> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    if u64::from_le_bytes(len) as usize != n {
        return Err(std::io::Error::other(format!(
            "a rank sent {} values, expected {n}: the ranks run different models or batches",
            u64::from_le_bytes(len)
        )));
    }
    let mut bytes = vec![0u8; 4 * n];
    r.read_exact(&mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

impl AllReduce for TcpAllReduce {
    fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut v: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let n = v.len();
        let mut links = self.links.lock().expect("all-reduce lock");
        if self.rank == 0 {
            for (r, _) in links.iter_mut() {
                let theirs = recv(r, n).map_err(|e| io_err("receiving", e))?;
                v.iter_mut().zip(theirs).for_each(|(a, b)| *a += b);
            }
            for (_, w) in links.iter_mut() {
                send(w, &v).map_err(|e| io_err("sending", e))?;
            }
        } else {
            let (r, w) = &mut links[0];
            send(w, &v).map_err(|e| io_err("sending", e))?;
            v = recv(r, n).map_err(|e| io_err("receiving", e))?;
        }
        Tensor::from_vec(v, x.shape(), x.device())?.to_dtype(x.dtype())
    }

    fn describe(&self) -> String {
        "tcp".into()
    }
}

#[cfg(feature = "nccl")]
pub use nccl::NcclAllReduce;

#[cfg(feature = "nccl")]
mod nccl {
    use super::AllReduce;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda::cudarc::driver::CudaStream;
    use candle_core::cuda::cudarc::nccl::safe::NcclType;
    use candle_core::cuda::cudarc::nccl::{result, sys};
    use candle_core::{
        CpuStorage, CudaStorage, CustomOp1, DType, InplaceOp1, Layout, Shape, Tensor,
    };
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
            self.peer_sum =
                crate::dist::peer_sum::PeerSum::open(self, device, rank, size, same_host)?;
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

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
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
                Collective::AllGather(_) => {
                    nccl.scatter_or_gather(s.dtype(), src, dst, n, false)?
                }
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

        fn reduce_scatter_sum(
            &self,
            x: &Tensor,
            _: usize,
            size: usize,
        ) -> candle_core::Result<Tensor> {
            super::shard_len(x, size)?;
            x.contiguous()?
                .apply_op1_no_bwd(&IntoNew(self, Collective::ReduceScatter(size)))
        }

        fn all_gather(&self, x: &Tensor, _: usize, size: usize) -> candle_core::Result<Tensor> {
            x.flatten_all()?
                .contiguous()?
                .apply_op1_no_bwd(&IntoNew(self, Collective::AllGather(size)))
        }

        fn start_sum(&self, x: Tensor) -> candle_core::Result<Tensor> {
            let x = x.contiguous()?;
            x.inplace_op1(&SumInPlace(self))?;
            Ok(x)
        }

        fn wait_sums(&self) -> candle_core::Result<()> {
            self.compute.join(&self.side).map_err(driver_err)
        }

        fn describe(&self) -> String {
            match (
                &self.peer_sum,
                crate::kernels::enabled(crate::kernels::Fused::Oneshot),
            ) {
                (Some(_), true) => format!("nccl {} + one-shot sums", self.version),
                _ => format!("nccl {}", self.version),
            }
        }

        fn on_device(&self) -> bool {
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Three CPU ranks (threads) over TCP keep the contract of every backend: shapes, dtypes and
    /// exact sums of 1-D, 2-D and 3-D tensors, views, ZeRO's reduce-scatter and all-gather.
    #[test]
    fn tcp_collectives_keep_the_backend_contract() {
        let listener = TcpAllReduce::listen([127, 0, 0, 1].into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let size = 3;
        let dtypes = [DType::F32, DType::BF16, DType::F16];
        let ranks: Vec<_> = (1..size)
            .map(|r| {
                std::thread::spawn(move || {
                    let c = TcpAllReduce::connect(addr, r).unwrap();
                    crate::dist::contract::check(&c, r, size, &dtypes, &Device::Cpu);
                })
            })
            .collect();
        let root = TcpAllReduce::serve(listener, size, Duration::from_secs(10)).unwrap();
        crate::dist::contract::check(&root, 0, size, &dtypes, &Device::Cpu);
        for r in ranks {
            r.join().unwrap();
        }
    }
}
