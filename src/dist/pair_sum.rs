//! Data parallelism's started sums between the two GPUs of one host as copy-engine copies
//! (`--fused copy-sum`, with `--dp-overlap`, #34). NCCL's all-reduce beside the backward holds
//! SMs for its whole length and slowed the backward more than it hid (docs/perf-notes.md, "The
//! gradients' all-reduce under the backward"); a copy engine moves the bytes over NVLink
//! without SMs. Each rank copies every gradient group it starts into the other rank's region
//! (on the side stream, under the rest of the backward); after the backward each rank adds
//! what it received to its own groups (x + y on one rank, y + x on the other: the same f32
//! bits, as NCCL's sum of two).
//!
//! Each rank's region (IPC-shared through [`PeerSum`]): FLAGS bytes of flags, then the data.
//! Flags, written by the other rank with a one-thread kernel on its compute stream (after the
//! work they announce) and waited for with another (`kernels::pair_signal`, `pair_wait`):
//! ARRIVED = e once its copies of step e are in this region; CONSUMED = e once it has added
//! what this rank sent in step e, so this rank may write step e + 1 over it.

use super::peer_sum::PeerSum;
use super::AllReduce;
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{sys, CudaStream, DevicePtr};
use candle_core::{CpuStorage, CudaDevice, CudaStorage, DType, Device, InplaceOp1, Layout, Tensor};
use std::sync::Mutex;

const FLAGS: usize = 256;
const ARRIVED: u64 = 0;
const CONSUMED: u64 = 4;
/// Each started sum's run starts on this boundary.
const ALIGN: usize = 256;

/// This rank's side of the pair.
pub struct PairSum {
    region: PeerSum,
    /// The rank's device: the flags' kernels and the adds run on its (compute) stream.
    device: CudaDevice,
    rank: usize,
    /// Data bytes a region holds: every started sum of a step.
    bytes: usize,
    step: Mutex<Step>,
}

/// The step under way: its number (from 1), where the next copy goes, what was started.
struct Step {
    epoch: u32,
    cursor: usize,
    started: Vec<(Tensor, usize)>,
}

fn check(r: sys::CUresult, what: &str) -> candle_core::Result<()> {
    r.result()
        .map_err(|e| candle_core::Error::Msg(format!("copy-engine sums, {what}: {e:?}")))
}

impl PairSum {
    /// Maps a region of `bytes` of data a rank between rank `rank` and the other rank of
    /// `nccl` (both call it, in the same place). None, on both, where either cannot (the note
    /// says why): NCCL then sums.
    pub fn open(
        nccl: &dyn AllReduce,
        device: &Device,
        rank: usize,
        bytes: usize,
    ) -> candle_core::Result<Option<Self>> {
        let Device::Cuda(dev) = device else {
            return Ok(None);
        };
        let what = "copy-engine sums";
        let region = PeerSum::open_sized(nccl, device, (rank, 2), FLAGS + bytes, what)?;
        Ok(region.map(|region| Self {
            region,
            device: dev.clone(),
            rank,
            bytes,
            step: Mutex::new(Step {
                epoch: 1,
                cursor: 0,
                started: Vec::new(),
            }),
        }))
    }

    fn own(&self) -> u64 {
        self.region.base(self.rank)
    }

    fn peer(&self) -> u64 {
        self.region.base(1 - self.rank)
    }

    /// Starts `x`'s sum (contiguous, on the GPU; the caller keeps it and reads it after
    /// [`PairSum::finish`]): a copy into the other rank's region on `side`, after `compute`'s
    /// work so far. False where the step's region is full (the caller sums it otherwise).
    pub fn start(
        &self,
        x: &Tensor,
        compute: &CudaStream,
        side: &CudaStream,
    ) -> candle_core::Result<bool> {
        let mut step = self.step.lock().expect("pair sum lock");
        let at = step.cursor;
        let bytes = x.elem_count() * x.dtype().size_in_bytes();
        if at + bytes > self.bytes {
            return Ok(false);
        }
        if step.started.is_empty() {
            // The other rank has added what we sent last step (long done: it did so before
            // its forward), so its region may be written; the side stream follows compute.
            crate::kernels::pair_wait(&self.device, self.own() + CONSUMED, step.epoch - 1)?;
        }
        side.join(compute).map_err(candle_core::Error::wrap)?;
        let dst = self.peer() + (FLAGS + at) as u64;
        x.inplace_op1(&CopyTo { dst, side })?;
        step.cursor = (at + bytes).next_multiple_of(ALIGN);
        step.started.push((x.clone(), at));
        Ok(true)
    }

    /// Ends the step: tells the other rank our copies are in, waits for its copies, adds them
    /// to what was started (on `compute`, after `side`), and tells it so. False when nothing
    /// was started.
    pub fn finish(&self, compute: &CudaStream, side: &CudaStream) -> candle_core::Result<bool> {
        let mut step = self.step.lock().expect("pair sum lock");
        if step.started.is_empty() {
            return Ok(false);
        }
        let e = step.epoch;
        // After the copies (the join), the flag that announces them; then theirs, the adds,
        // and the flag that frees their region.
        compute.join(side).map_err(candle_core::Error::wrap)?;
        crate::kernels::pair_signal(&self.device, self.peer() + ARRIVED, e)?;
        crate::kernels::pair_wait(&self.device, self.own() + ARRIVED, e)?;
        for (x, at) in step.started.drain(..) {
            crate::kernels::pair_add_in_place(&x, self.own() + (FLAGS + at) as u64)?;
        }
        crate::kernels::pair_signal(&self.device, self.peer() + CONSUMED, e)?;
        step.epoch += 1;
        step.cursor = 0;
        Ok(true)
    }
}

/// Copies the tensor to `dst` (the other rank's region) on `side`, a copy engine's work.
struct CopyTo<'a> {
    dst: u64,
    side: &'a CudaStream,
}

impl InplaceOp1 for CopyTo<'_> {
    fn name(&self) -> &'static str {
        "copy-to-peer"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("copy-engine sums of a CPU tensor")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("copy-engine sums need a contiguous tensor")
        };
        let size = s.dtype().size_in_bytes();
        let src = match s.dtype() {
            DType::F32 => s.as_cuda_slice::<f32>()?.device_ptr(self.side).0,
            DType::BF16 => s.as_cuda_slice::<half::bf16>()?.device_ptr(self.side).0,
            DType::F16 => s.as_cuda_slice::<half::f16>()?.device_ptr(self.side).0,
            other => candle_core::bail!("copy-engine sums of {other:?}"),
        } + (start * size) as u64;
        // SAFETY: src holds (end − start) values of the tensor; dst is in the other rank's
        // live region with room for them (PairSum::start checked); ordered on `side` after
        // the compute stream's work that made them.
        check(
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(
                    self.dst,
                    src,
                    (end - start) * size,
                    self.side.cu_stream(),
                )
            },
            "copy",
        )
    }
}
