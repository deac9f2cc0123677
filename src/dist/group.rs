//! One rank of a tensor-parallel run: its device, the rendezvous with the other ranks, and the
//! all-reduce they share (NCCL on GPUs, TCP on CPUs).

use super::collective::{AllReduce, TcpAllReduce, Tp};
use super::rendezvous::{Peer, Rendezvous};
use super::world::World;
use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use candle_core::Device;
use serde_json::json;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

/// What a run needs to know about its tensor-parallel group.
#[derive(Clone)]
pub struct RankContext {
    pub world: World,
    pub device: Device,
    /// This rank's device (`cuda:LOCAL_RANK`).
    pub device_spec: DeviceSpec,
    /// Rank, size and all-reduce, in the form the sharded models take (`--tp`); a `--dp`
    /// trainer uses the same three.
    pub group: Tp,
    /// Every rank in rank order, with its host, pid and GPU.
    pub peers: Vec<Peer>,
    /// `nccl 2.28.9` or `tcp`.
    pub backend: String,
}

/// This process's rank, joined to the others.
pub struct GroupRank {
    pub ctx: RankContext,
    rendezvous: Rendezvous,
}

impl GroupRank {
    /// Opens this rank's device (`cuda:LOCAL_RANK` for a CUDA run), meets the other ranks
    /// (rank 0 showing the count with `progress`) and joins the all-reduce group.
    pub fn join(
        world: World,
        device: DeviceSpec,
        timeout: Duration,
        progress: bool,
    ) -> Result<Self> {
        let device_spec = match device {
            DeviceSpec::Cpu => DeviceSpec::Cpu,
            // `--device cuda`: the CLI refuses cuda:N with N > 0 before any rank starts.
            DeviceSpec::Cuda(_) => DeviceSpec::Cuda(world.local_rank),
        };
        let dev = open(device_spec)?;
        let mut info = json!({ "local_rank": world.local_rank, "device": device_spec.to_string() });
        if let Some(uuid) = crate::device::cuda_uuid(&dev) {
            info["gpu_uuid"] = uuid.into();
        }
        if let Some(name) = gpu_name(&dev) {
            info["gpu"] = name.into();
        }
        let me = Peer {
            rank: world.rank,
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            info,
        };
        let mut listener: Option<TcpListener> = None;
        let make_id = || -> Result<Vec<u8>> {
            match &dev {
                Device::Cpu => {
                    // The id CPU ranks share: the address of rank 0's all-reduce socket.
                    let l = TcpAllReduce::listen(world.master.ip())?;
                    let addr = l.local_addr()?;
                    listener = Some(l);
                    Ok(addr.to_string().into_bytes())
                }
                _ => nccl_id(),
            }
        };
        let rendezvous = Rendezvous::join(&world, me, make_id, timeout, progress)?;
        let reduce: Arc<dyn AllReduce> = match &dev {
            Device::Cpu if world.rank == 0 => {
                let l = listener.take().expect("rank 0 made the id");
                Arc::new(TcpAllReduce::serve(l, world.size, timeout)?)
            }
            Device::Cpu => {
                let addr = String::from_utf8_lossy(&rendezvous.id)
                    .parse()
                    .map_err(|_| Error::Config("rank 0 sent a bad all-reduce address".into()))?;
                Arc::new(TcpAllReduce::connect(addr, world.rank)?)
            }
            _ => {
                let same_host = rendezvous
                    .peers
                    .iter()
                    .all(|p| p.host == me_host(&rendezvous));
                nccl_join(&dev, world.rank, world.size, &rendezvous.id, same_host)?
            }
        };
        let ctx = RankContext {
            group: Tp {
                rank: world.rank,
                size: world.size,
                reduce: Some(reduce.clone()),
            },
            backend: reduce.describe(),
            peers: rendezvous.peers.clone(),
            world,
            device: dev,
            device_spec,
        };
        Ok(Self { ctx, rendezvous })
    }

    /// A clean end: tells the others this rank is done (rank 0 waits for all of them).
    pub fn finish(self, timeout: Duration) -> Result<()> {
        self.rendezvous.finish(timeout)
    }
}

/// A CUDA device with its own stream (NCCL runs on it, ordered with candle's kernels).
pub(crate) fn open(spec: DeviceSpec) -> Result<Device> {
    match spec {
        DeviceSpec::Cpu => Ok(Device::Cpu),
        DeviceSpec::Cuda(n) => open_cuda_with_stream(n),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda_with_stream(n: usize) -> Result<Device> {
    let device = Device::new_cuda_with_stream(n).map_err(|e| {
        Error::Unsupported(format!(
            "cannot open CUDA device {n} ({e}): does this host have a GPU for every rank (nvidia-smi)?"
        ))
    })?;
    if let Device::Cuda(cuda) = &device {
        // A created stream puts cudarc in multi-stream mode, which records and waits on CUDA
        // events around every kernel argument. Everything here (candle's kernels, cuBLAS,
        // NCCL) runs on this one stream, so that ordering is already given.
        // SAFETY: no tensor of this device is used on another stream.
        unsafe { cuda.disable_event_tracking() };
        crate::device::keep_freed_memory(cuda)?;
    }
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda_with_stream(n: usize) -> Result<Device> {
    DeviceSpec::Cuda(n).open()
}

#[cfg(feature = "cuda")]
fn gpu_name(dev: &Device) -> Option<String> {
    match dev {
        Device::Cuda(d) => d.cuda_stream().context().name().ok(),
        _ => None,
    }
}

#[cfg(not(feature = "cuda"))]
fn gpu_name(_: &Device) -> Option<String> {
    None
}

#[cfg(feature = "nccl")]
fn nccl_id() -> Result<Vec<u8>> {
    super::nccl::NcclAllReduce::new_id()
}

/// Rank 0's host name (the ranks run on one host when all share it).
fn me_host(r: &Rendezvous) -> &str {
    r.peers.first().map_or("", |p| p.host.as_str())
}

/// Joins NCCL and, where the ranks share a host, maps the one-shot sums' buffers (`--fused
/// oneshot`) and notes the host for copy-engine sums (`--fused copy-sum`).
#[cfg(feature = "nccl")]
fn nccl_join(
    dev: &Device,
    rank: usize,
    size: usize,
    id: &[u8],
    same_host: bool,
) -> Result<Arc<dyn AllReduce>> {
    let mut nccl = super::nccl::NcclAllReduce::join(dev, rank, size, id)?;
    nccl.map_peer_buffers(dev, rank, size, same_host)?;
    Ok(Arc::new(nccl))
}

/// The error of `--tp` on GPUs in a build without NCCL.
pub const NO_NCCL: &str = "--tp on GPUs needs NCCL: rebuild with `cargo build --release --features nccl` (see docs/environment.md, CUDA build); --device cpu runs tensor parallelism without it";

#[cfg(not(feature = "nccl"))]
fn nccl_id() -> Result<Vec<u8>> {
    Err(Error::Unsupported(NO_NCCL.into()))
}

#[cfg(not(feature = "nccl"))]
fn nccl_join(_: &Device, _: usize, _: usize, _: &[u8], _: bool) -> Result<Arc<dyn AllReduce>> {
    Err(Error::Unsupported(NO_NCCL.into()))
}
