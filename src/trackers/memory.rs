//! Peak memory of a run, the engine's own count: [`MemoryTracker`] reads the CUDA memory pool's
//! high-water marks (reset at start), or on CPU the process's peak resident set.

use crate::error::Result;
use candle_core::Device;

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
    /// CUDA only: high-water mark of the pool's reserved bytes (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`):
    /// what the pool took from the driver, >= `peak_bytes` (freed blocks it keeps, granularity).
    #[serde(default)]
    pub pool_reserved_bytes: Option<u64>,
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
                ..Default::default()
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
    use crate::device::{cuda_err, mem_pool as pool};
    use crate::error::Result;
    use candle_core::cuda::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::CudaDevice;

    use sys::CUmemPool_attribute::{
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH as RESERVED_HIGH,
        CU_MEMPOOL_ATTR_USED_MEM_HIGH as USED_HIGH,
    };

    pub fn reset_peak(d: &CudaDevice) -> Result<()> {
        let pool = pool(d)?;
        for attr in [USED_HIGH, RESERVED_HIGH] {
            let mut zero: u64 = 0;
            // SAFETY: both high-water attributes take a cuuint64_t; zero is the only value the
            // driver accepts for them (a reset), and `zero` outlives the call.
            unsafe { result::mem_pool::set_attribute(pool, attr, &mut zero as *mut u64 as *mut _) }
                .map_err(cuda_err)?;
        }
        Ok(())
    }

    fn get(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the high-water attributes are cuuint64_t, written into `v`, which outlives the call.
        unsafe { result::mem_pool::get_attribute(pool, attr, &mut v as *mut u64 as *mut _) }
            .map_err(cuda_err)?;
        Ok(v)
    }

    pub fn read(d: &CudaDevice) -> Result<MemoryReading> {
        let pool = pool(d)?;
        let (free, total) = d.cuda_stream().context().mem_get_info().map_err(cuda_err)?;
        Ok(MemoryReading {
            peak_bytes: get(pool, USED_HIGH)?,
            device_used_bytes: Some((total - free) as u64),
            pool_reserved_bytes: Some(get(pool, RESERVED_HIGH)?),
        })
    }
}
