//! The collectives of parallel runs: a sum over ranks of a tensor every rank holds with the
//! same shape (Megatron's all-reduce after a row-parallel projection, data parallelism's
//! gradient sum), and ZeRO-2/3's reduce-scatter and all-gather of flat shards.
//!
//! - [`TcpAllReduce`]: tensors through rank 0 over TCP, for CPU ranks (tests, CI, laptops).
//!   Rank 0 sums in rank order, so every rank gets the same bits.
//! - `NcclAllReduce` (feature `nccl`, in `super::nccl`): NCCL on the device's stream, as a
//!   candle custom op, or started on a second stream for sums that overlap the backward (data
//!   parallelism).

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
    /// (r + Σ x, LayerNorm(r + Σ x)) over the last dim, with the norm's w and b (C,), in one
    /// pass where the backend can (tensor-parallel decoding's sum, residual add and next norm
    /// in one kernel); None: the caller sums, then adds and norms.
    fn sum_add_layer_norm(
        &self,
        _x: &Tensor,
        _r: &Tensor,
        _w: &Tensor,
        _b: &Tensor,
        _eps: f64,
    ) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
    /// [`AllReduce::sum_add_layer_norm`] of the output of `gemv`, a row-parallel projection's
    /// decode GEMV not yet run, which pushes its output to the other ranks as it makes it
    /// where the backend can (one-shot sums); None: nothing ran, the caller runs the GEMV.
    fn gemv_sum_add_layer_norm(
        &self,
        _gemv: &crate::kernels::PendingGemv,
        _r: &Tensor,
        _norm: (&Tensor, &Tensor, f64),
    ) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
    /// Readies started sums ([`AllReduce::start_sum`]) of up to `bytes` a step for a path of
    /// their own where the backend has one (copy engines between two GPUs of one host); every
    /// rank calls it, in the same place. The default has none.
    fn prepare_started_sums(&self, _bytes: usize) -> candle_core::Result<()> {
        Ok(())
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
pub(crate) fn shard_len(x: &Tensor, size: usize) -> candle_core::Result<usize> {
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
