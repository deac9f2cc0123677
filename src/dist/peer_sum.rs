//! The buffers of the one-shot sum (`kernels::oneshot_sum`, `--fused oneshot`), mapped between
//! the ranks of one host: each rank allocates one, hands out a CUDA IPC handle to it (over
//! NCCL's all-gather), and maps every other rank's. Ranks that are threads of one process
//! (the two-GPU tests) use each other's addresses directly, with peer access on. Where any
//! rank cannot map any buffer (ranks on several hosts, GPUs without peer access), every rank
//! keeps NCCL for all sums: the ranks agree on it with one NCCL sum.

use super::collective::AllReduce;
use crate::kernels::{PeerBuffers, ONESHOT_MAX_RANKS};
use candle_core::cuda::cudarc::driver::sys;
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// What a rank tells the others: its IPC handle, raw address, pid and device ordinal.
const HANDLE: usize = 64;
const RECORD: usize = HANDLE + 8 + 4 + 1 + 1;

/// This rank's buffer, the others' as mapped here, and the device table of all of them.
pub struct PeerSum {
    buffers: PeerBuffers,
    own: sys::CUdeviceptr,
    /// Every rank's buffer as this process addresses it (the device table's host copy).
    bases: [u64; ONESHOT_MAX_RANKS],
    /// Other ranks' buffers opened through IPC (closed on drop).
    opened: Vec<sys::CUdeviceptr>,
    table: sys::CUdeviceptr,
    ctx: Arc<candle_core::cuda::cudarc::driver::CudaContext>,
}

// SAFETY: raw device addresses, used from the thread that runs the model.
unsafe impl Send for PeerSum {}
unsafe impl Sync for PeerSum {}

fn check(r: sys::CUresult, what: &str) -> Result<(), String> {
    r.result().map_err(|e| format!("{what}: {e:?}"))
}

impl PeerSum {
    /// Maps the buffers of the `world` ranks of `nccl` on `device` (every rank calls it, in
    /// the same place). None, on every rank, where some rank could not: the reason is printed
    /// by rank 0.
    pub fn open(
        nccl: &dyn AllReduce,
        device: &Device,
        rank: usize,
        world: usize,
        same_host: bool,
    ) -> candle_core::Result<Option<Self>> {
        // One rank too: its kernels then sum alone, which is how one GPU tests them.
        if !(1..=ONESHOT_MAX_RANKS).contains(&world) || !same_host {
            return Ok(None);
        }
        let bytes = PeerBuffers::buffer_bytes();
        Self::open_sized(nccl, device, (rank, world), bytes, "one-shot sums")
    }

    /// [`PeerSum::open`] for a buffer of `bytes` (zeroed) a rank, for `what` (named in the
    /// notes); a failure on any rank makes every rank go without.
    pub fn open_sized(
        nccl: &dyn AllReduce,
        device: &Device,
        (rank, world): (usize, usize),
        bytes: usize,
        what: &str,
    ) -> candle_core::Result<Option<Self>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let ctx = dev.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(candle_core::Error::wrap)?;
        let (own, mine) = match allocate(ctx.ordinal(), bytes) {
            Ok(v) => v,
            Err(e) => (0, failed_record(&e, rank, what)),
        };
        let all = exchange(nccl, device, &mine, rank, world)?;
        let mut sum = Self {
            buffers: PeerBuffers {
                table: 0,
                rank,
                world,
            },
            own,
            bases: [0; ONESHOT_MAX_RANKS],
            opened: Vec::new(),
            table: 0,
            ctx,
        };
        let mapped = match all.iter().all(|r| r[RECORD - 1] == 1) {
            true => sum.map(&all),
            false => Err("a rank could not share its buffer".into()),
        };
        let failures = Tensor::new(&[mapped.is_err() as u8 as f32], device)?;
        let failures = nccl.all_reduce_sum(&failures)?.to_vec1::<f32>()?[0];
        if let Err(e) = &mapped {
            eprintln!("note: rank {rank}: {what} off ({e}); NCCL sums instead");
        }
        Ok((failures == 0.).then_some(sum))
    }

    /// Where the kernel finds the buffers.
    pub fn buffers(&self) -> &PeerBuffers {
        &self.buffers
    }

    /// Rank `rank`'s buffer, as this process addresses it.
    pub fn base(&self, rank: usize) -> u64 {
        self.bases[rank]
    }

    /// Maps every other rank's buffer from its record, and writes the table.
    fn map(&mut self, all: &[Vec<u8>]) -> Result<(), String> {
        let pid = std::process::id();
        let mut bases = [0u64; ONESHOT_MAX_RANKS];
        for (r, rec) in all.iter().enumerate() {
            let (addr, their_pid, ordinal) = fields(rec);
            bases[r] = if r == self.buffers.rank {
                self.own
            } else if their_pid == pid {
                enable_peer_access(ordinal)?;
                addr
            } else {
                let mut handle = sys::CUipcMemHandle_st {
                    reserved: [0; HANDLE],
                };
                for (d, s) in handle.reserved.iter_mut().zip(&rec[..HANDLE]) {
                    *d = *s as core::ffi::c_char;
                }
                let mut ptr = 0;
                let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
                // SAFETY: the handle names a live allocation of rank r, which keeps it until
                // its PeerSum is dropped.
                check(
                    unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, lazy) },
                    &format!("opening rank {r}'s buffer (CUDA IPC)"),
                )?;
                self.opened.push(ptr);
                ptr
            };
        }
        self.bases = bases;
        let bytes = std::mem::size_of_val(&bases);
        // SAFETY: a new allocation of `bytes`, filled from the host array of that size.
        unsafe {
            check(sys::cuMemAlloc_v2(&mut self.table, bytes), "table")?;
            check(
                sys::cuMemcpyHtoD_v2(self.table, bases.as_ptr().cast(), bytes),
                "table copy",
            )?;
        }
        self.buffers.table = self.table;
        Ok(())
    }
}

impl Drop for PeerSum {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: our allocations and mappings; no kernel uses them after the model is gone
        // (the context is synchronised first).
        unsafe {
            let _ = sys::cuCtxSynchronize();
            for &p in &self.opened {
                let _ = sys::cuIpcCloseMemHandle(p);
            }
            for p in [self.table, self.own] {
                if p != 0 {
                    let _ = sys::cuMemFree_v2(p);
                }
            }
        }
    }
}

/// This rank's buffer (flags zeroed) and its record: IPC handle, address, pid, ordinal, ok.
fn allocate(ordinal: usize, bytes: usize) -> Result<(sys::CUdeviceptr, Vec<u8>), String> {
    let mut own = 0;
    let mut handle = sys::CUipcMemHandle_st {
        reserved: [0; HANDLE],
    };
    // SAFETY: a new allocation (cuMemAlloc: IPC cannot share stream-ordered pool memory),
    // zeroed before any kernel reads it (the synchronize): a line's epochs must not match by
    // chance.
    unsafe {
        check(sys::cuMemAlloc_v2(&mut own, bytes), "buffer")?;
        check(sys::cuMemsetD8_v2(own, 0, bytes), "zeroing")?;
        check(sys::cuCtxSynchronize(), "zeroing")?;
        check(sys::cuIpcGetMemHandle(&mut handle, own), "IPC handle")?;
    }
    let mut rec: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
    rec.extend_from_slice(&own.to_le_bytes());
    rec.extend_from_slice(&std::process::id().to_le_bytes());
    rec.push(ordinal as u8);
    rec.push(1);
    Ok((own, rec))
}

/// The record of a rank that could not share a buffer (its last byte 0).
fn failed_record(why: &str, rank: usize, what: &str) -> Vec<u8> {
    eprintln!("note: rank {rank}: no buffer for {what} ({why})");
    vec![0; RECORD]
}

/// (address, pid, device ordinal) of a record.
fn fields(rec: &[u8]) -> (u64, u32, u8) {
    let addr = u64::from_le_bytes(rec[HANDLE..HANDLE + 8].try_into().unwrap());
    let pid = u32::from_le_bytes(rec[HANDLE + 8..HANDLE + 12].try_into().unwrap());
    (addr, pid, rec[HANDLE + 12])
}

/// Every rank's record, in rank order, through NCCL's all-gather (bytes as exact f32s).
fn exchange(
    nccl: &dyn AllReduce,
    device: &Device,
    mine: &[u8],
    rank: usize,
    world: usize,
) -> candle_core::Result<Vec<Vec<u8>>> {
    let values: Vec<f32> = mine.iter().map(|&b| b as f32).collect();
    let gathered = nccl.all_gather(&Tensor::new(values, device)?, rank, world)?; // (W·RECORD,)
    let bytes: Vec<u8> = gathered
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?
        .into_iter()
        .map(|v| v as u8)
        .collect();
    Ok(bytes.chunks(RECORD).map(<[u8]>::to_vec).collect())
}

/// Lets this thread's context read and write GPU `ordinal`'s memory (ranks that are threads
/// of one process).
fn enable_peer_access(ordinal: u8) -> Result<(), String> {
    let (mut dev, mut peer) = (0, std::ptr::null_mut());
    // SAFETY: plain driver queries; the peer's primary context is retained by its own rank.
    unsafe {
        check(sys::cuDeviceGet(&mut dev, ordinal as i32), "peer device")?;
        check(
            sys::cuDevicePrimaryCtxRetain(&mut peer, dev),
            "peer context",
        )?;
        let r = sys::cuCtxEnablePeerAccess(peer, 0);
        let _ = sys::cuDevicePrimaryCtxRelease_v2(dev);
        match r {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(())
            }
            e => Err(format!("peer access to GPU {ordinal}: {e:?}")),
        }
    }
}
