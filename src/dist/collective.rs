//! The one collective tensor parallelism needs: a sum over ranks of a tensor every rank holds
//! with the same shape (Megatron's all-reduce after a row-parallel projection).
//!
//! - [`TcpAllReduce`]: tensors through rank 0 over TCP, for CPU ranks (tests, CI, laptops).
//!   Rank 0 sums in rank order, so every rank gets the same bits.
//! - `NcclAllReduce` (feature `nccl`): NCCL on the device's stream, as a candle custom op.

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
    /// `tcp` or `nccl X.Y.Z`, for the log header.
    fn describe(&self) -> String;
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
    use candle_core::cuda::cudarc::nccl::safe::{Comm, Id, ReduceOp};
    use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Shape, Tensor};
    use half::{bf16, f16};

    /// An NCCL communicator over one GPU per rank, used on that GPU's candle stream so the
    /// all-reduce is ordered with the kernels around it.
    pub struct NcclAllReduce {
        comm: Comm,
        version: String,
    }

    // SAFETY: `Comm` holds a raw NCCL handle. A rank uses it from one thread at a time (the
    // model runs on the main thread); NCCL allows a communicator to be used from any thread
    // as long as calls are not concurrent.
    unsafe impl Send for NcclAllReduce {}
    unsafe impl Sync for NcclAllReduce {}

    impl NcclAllReduce {
        /// A new unique id (rank 0), as the bytes the rendezvous hands out.
        pub fn new_id() -> crate::error::Result<Vec<u8>> {
            let id = Id::new().map_err(|e| {
                crate::error::Error::Unsupported(format!(
                    "NCCL could not make a unique id ({e:?}): is libnccl.so.2 installed (bench env)?"
                ))
            })?;
            Ok(id.internal().iter().map(|&c| c as u8).collect())
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
            let mut internal = [0 as core::ffi::c_char; 128];
            for (d, s) in internal.iter_mut().zip(id) {
                *d = *s as core::ffi::c_char;
            }
            let comm = Comm::from_rank(dev.cuda_stream(), rank, size, Id::uninit(internal))
                .map_err(|e| {
                    crate::error::Error::Unsupported(format!(
                        "NCCL init failed on rank {rank} of {size} ({e:?}): run `bench env` on each host; NCCL_DEBUG=INFO shows why"
                    ))
                })?;
            Ok(Self {
                comm,
                version: version(),
            })
        }
    }

    /// NCCL's version (`ncclGetVersion`: major·10000 + minor·100 + patch since 2.9).
    fn version() -> String {
        let mut v: core::ffi::c_int = 0;
        // SAFETY: ncclGetVersion writes one int.
        let ok = unsafe { candle_core::cuda::cudarc::nccl::sys::ncclGetVersion(&mut v) };
        if ok != candle_core::cuda::cudarc::nccl::sys::ncclResult_t::ncclSuccess {
            return "unknown".into();
        }
        crate::env::nccl_version(v)
    }

    impl CustomOp1 for &NcclAllReduce {
        fn name(&self) -> &'static str {
            "nccl-all-reduce"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
            candle_core::bail!("NCCL all-reduce of a CPU tensor")
        }

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let Some((start, end)) = l.contiguous_offsets() else {
                candle_core::bail!("NCCL all-reduce needs a contiguous tensor")
            };
            let dev = s.device().clone();
            let nccl = |e| candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}"));
            macro_rules! reduce {
                ($t:ty) => {{
                    let src = s.as_cuda_slice::<$t>()?.slice(start..end);
                    // SAFETY: every element is written by the all-reduce before it is read.
                    let mut dst = unsafe { dev.alloc::<$t>(end - start)? };
                    self.comm
                        .all_reduce(&src, &mut dst, &ReduceOp::Sum)
                        .map_err(nccl)?;
                    CudaStorage::wrap_cuda_slice(dst, dev)
                }};
            }
            let out = match s.dtype() {
                DType::F32 => reduce!(f32),
                DType::BF16 => reduce!(bf16),
                DType::F16 => reduce!(f16),
                other => candle_core::bail!("NCCL all-reduce of {other:?}"),
            };
            Ok((out, l.shape().clone()))
        }
    }

    impl AllReduce for NcclAllReduce {
        fn all_reduce_sum(&self, x: &Tensor) -> candle_core::Result<Tensor> {
            x.contiguous()?.apply_op1_no_bwd(&self)
        }

        fn describe(&self) -> String {
            format!("nccl {}", self.version)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn tcp_all_reduce_sums_in_rank_order_and_keeps_dtype() {
        let listener = TcpAllReduce::listen([127, 0, 0, 1].into()).unwrap();
        let addr = listener.local_addr().unwrap();
        let size = 3;
        let ranks: Vec<_> = (1..size)
            .map(|r| {
                std::thread::spawn(move || {
                    let c = TcpAllReduce::connect(addr, r).unwrap();
                    let x = Tensor::full(r as f32, (2, 3), &Device::Cpu).unwrap();
                    c.all_reduce_sum(&x).unwrap()
                })
            })
            .collect();
        let root = TcpAllReduce::serve(listener, size, Duration::from_secs(10)).unwrap();
        let x = Tensor::arange(0f32, 6., &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let sum = root.all_reduce_sum(&x).unwrap();
        assert_eq!(sum.dtype(), DType::BF16);
        let want = vec![vec![3f32, 4., 5.], vec![6., 7., 8.]];
        let got: Vec<Vec<f32>> = sum.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        assert_eq!(got, want);
        for r in ranks {
            let theirs: Vec<Vec<f32>> = r.join().unwrap().to_vec2().unwrap();
            assert_eq!(theirs, want);
        }
    }
}
