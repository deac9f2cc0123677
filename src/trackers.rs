//! Small start/stop trackers that suites use to measure (as optimum-benchmark's trackers):
//! latency of a device region, and peak memory of the run.

use crate::device::synchronize;
use crate::error::Result;
use candle_core::Device;
use std::time::Instant;

/// Times regions of device work: synchronizes before each clock read, because CUDA launches
/// return before the work is done.
pub struct LatencyTracker<'a> {
    device: &'a Device,
    start: Option<Instant>,
}

impl<'a> LatencyTracker<'a> {
    pub fn new(device: &'a Device) -> Self {
        Self {
            device,
            start: None,
        }
    }

    pub fn start(&mut self) -> Result<()> {
        synchronize(self.device)?;
        self.start = Some(Instant::now());
        Ok(())
    }

    /// Milliseconds since `start`, after the device finished the region's work.
    pub fn stop_ms(&mut self) -> Result<f64> {
        synchronize(self.device)?;
        let start = self
            .start
            .take()
            .expect("LatencyTracker::stop_ms without start");
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }
}

/// Peak memory of a run, in bytes.
///
/// - CUDA: the high-water mark of bytes in use in the device's memory pool
///   (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`), which every candle allocation comes from
///   (cuMemAllocAsync): weights + activations, like torch's `max_memory_allocated`. It leaves
///   out the CUDA context and cuBLAS workspace (~0.6 GiB on an H100), reported apart as
///   `device_memory_used_bytes` (cuMemGetInfo: everything on the GPU, other processes too).
/// - CPU: the process's peak resident set (VmHWM), which includes the binary and tokenizer.
pub struct MemoryTracker {
    device: Device,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct MemoryReading {
    /// The peak defined above.
    pub peak_bytes: u64,
    /// CUDA only: used bytes on the whole GPU at the reading (cuMemGetInfo).
    pub device_used_bytes: Option<u64>,
}

impl MemoryTracker {
    /// Starts tracking: resets the pool's high-water mark.
    pub fn start(device: &Device) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            cuda_pool::reset_peak(d)?;
        }
        Ok(Self {
            device: device.clone(),
        })
    }

    pub fn read(&self) -> Result<MemoryReading> {
        match &self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => cuda_pool::read(d),
            _ => Ok(MemoryReading {
                peak_bytes: peak_rss_bytes().unwrap_or(0),
                device_used_bytes: None,
            }),
        }
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), if readable.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(feature = "cuda")]
mod cuda_pool {
    use super::MemoryReading;
    use crate::error::{Error, Result};
    use candle_core::cuda::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::CudaDevice;

    fn pool(d: &CudaDevice) -> Result<sys::CUmemoryPool> {
        let stream = d.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: cu_device comes from a live context; the pool is owned by the driver.
        unsafe { result::device::get_mem_pool(ctx.cu_device()) }.map_err(cuda_err)
    }

    fn cuda_err(e: result::DriverError) -> Error {
        Error::Unsupported(format!("CUDA memory query failed: {e:?}"))
    }

    pub fn reset_peak(d: &CudaDevice) -> Result<()> {
        let pool = pool(d)?;
        let mut zero: u64 = 0;
        // SAFETY: USED_MEM_HIGH takes a cuuint64_t; zero is the only value the driver accepts
        // for it (a reset), and `zero` outlives the call.
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut zero as *mut u64 as *mut _,
            )
        }
        .map_err(cuda_err)
    }

    pub fn read(d: &CudaDevice) -> Result<MemoryReading> {
        let pool = pool(d)?;
        let mut high: u64 = 0;
        // SAFETY: USED_MEM_HIGH is a cuuint64_t written into `high`, which outlives the call.
        unsafe {
            result::mem_pool::get_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &mut high as *mut u64 as *mut _,
            )
        }
        .map_err(cuda_err)?;
        let (free, total) = d.cuda_stream().context().mem_get_info().map_err(cuda_err)?;
        Ok(MemoryReading {
            peak_bytes: high,
            device_used_bytes: Some((total - free) as u64),
        })
    }
}
