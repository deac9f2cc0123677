//! What the driver sees of one GPU, through NVML: [`NvmlGpu`] reads a [`GpuSample`] (the
//! process's device memory, clocks, utilisation, power) or the energy counter; [`GpuSampler`]
//! samples on a thread over a region and sums the samples up as a [`GpuActivity`].

use crate::env::nvml_error;
use crate::error::{Error, Result};
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// One GPU seen through NVML, and the process whose memory to watch (ours, or the HF worker's).
#[derive(Clone)]
pub struct NvmlGpu {
    nvml: Arc<Nvml>,
    /// NVML index (see [`crate::env::nvml_index`]).
    pub index: u32,
    pub pid: u32,
}

/// One NVML reading.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// The process's device memory as the driver counts it; None when NVML does not list the
    /// pid (a container with its own PID namespace: NVML reports host PIDs).
    pub process_memory_bytes: Option<u64>,
    /// Used memory on the whole GPU (every process).
    pub device_memory_used_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    /// Percent of the sample period in which a kernel ran (NVML's "GPU utilization").
    pub utilization_percent: Option<u32>,
    pub power_watts: Option<f64>,
}

impl NvmlGpu {
    pub fn open(index: usize, pid: u32) -> Result<Self> {
        let nvml = Nvml::init()
            .map_err(|e| Error::Unsupported(format!("NVML unavailable: {}", nvml_error(e))))?;
        let gpu = Self {
            nvml: Arc::new(nvml),
            index: index as u32,
            pid,
        };
        gpu.device()?;
        Ok(gpu)
    }

    fn device(&self) -> Result<nvml_wrapper::Device<'_>> {
        self.nvml
            .device_by_index(self.index)
            .map_err(|e| Error::Unsupported(format!("NVML GPU {}: {}", self.index, nvml_error(e))))
    }

    /// Reads every field it can; a field NVML refuses is None.
    pub fn sample(&self) -> GpuSample {
        let Ok(d) = self.device() else {
            return GpuSample::default();
        };
        let process_memory_bytes = d.running_compute_processes().ok().and_then(|ps| {
            ps.iter()
                .find(|p| p.pid == self.pid)
                .and_then(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                })
        });
        GpuSample {
            process_memory_bytes,
            device_memory_used_bytes: d.memory_info().ok().map(|m| m.used),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            utilization_percent: d.utilization_rates().ok().map(|u| u.gpu),
            power_watts: d.power_usage().ok().map(|mw| mw as f64 / 1e3),
        }
    }

    /// NVML's total-energy counter (millijoules since the driver loaded; Volta and newer).
    pub fn energy_mj(&self) -> Result<u64> {
        self.device()?
            .total_energy_consumption()
            .map_err(|e| Error::Unsupported(format!("NVML energy counter: {}", nvml_error(e))))
    }
}

/// What a [`GpuSampler`] saw over its region.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuActivity {
    pub n_samples: usize,
    pub peak_process_memory_bytes: Option<u64>,
    pub peak_device_memory_used_bytes: Option<u64>,
    pub sm_clock_mhz_median: Option<f64>,
    pub utilization_percent_median: Option<f64>,
    pub power_watts_mean: Option<f64>,
}

impl GpuActivity {
    /// Peaks are maxima, clocks and utilisation medians, power the mean, each over the samples
    /// that have the field.
    pub fn of(samples: &[GpuSample]) -> Self {
        fn median(mut v: Vec<f64>) -> Option<f64> {
            if v.is_empty() {
                return None;
            }
            v.sort_by(f64::total_cmp);
            let n = v.len();
            Some(if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.
            })
        }
        let power: Vec<f64> = samples.iter().filter_map(|s| s.power_watts).collect();
        Self {
            n_samples: samples.len(),
            peak_process_memory_bytes: samples.iter().filter_map(|s| s.process_memory_bytes).max(),
            peak_device_memory_used_bytes: samples
                .iter()
                .filter_map(|s| s.device_memory_used_bytes)
                .max(),
            sm_clock_mhz_median: median(
                samples
                    .iter()
                    .filter_map(|s| s.sm_clock_mhz.map(f64::from))
                    .collect(),
            ),
            utilization_percent_median: median(
                samples
                    .iter()
                    .filter_map(|s| s.utilization_percent.map(f64::from))
                    .collect(),
            ),
            power_watts_mean: (!power.is_empty())
                .then(|| power.iter().sum::<f64>() / power.len() as f64),
        }
    }
}

/// Samples NVML on a thread every `interval` from `start` to `stop`: the process's device
/// memory (peak), SM clock and utilisation (medians), power (mean). NVML's memory count is the
/// driver's: the engine's pool high-water ([`MemoryTracker`](super::MemoryTracker)) plus the
/// CUDA context and loaded kernels (~0.5 GiB on an H100), cuBLAS workspaces, and what the pool
/// reserved but is not using (freed blocks it keeps, allocation granularity).
pub struct GpuSampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<GpuSample>>,
}

impl GpuSampler {
    pub fn start(gpu: NvmlGpu, interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = vec![gpu.sample()];
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(interval);
                samples.push(gpu.sample());
            }
            samples
        });
        Self { stop, handle }
    }

    pub fn stop(self) -> GpuActivity {
        self.stop.store(true, Ordering::Relaxed);
        GpuActivity::of(&self.handle.join().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_takes_peaks_medians_and_mean_over_present_fields() {
        let s = |mem: Option<u64>, clock: u32, util: u32, w: f64| GpuSample {
            process_memory_bytes: mem,
            device_memory_used_bytes: Some(10),
            sm_clock_mhz: Some(clock),
            utilization_percent: Some(util),
            power_watts: Some(w),
        };
        let a = GpuActivity::of(&[
            s(Some(5), 1980, 100, 600.),
            s(None, 1755, 90, 500.),
            s(Some(7), 1980, 95, 400.),
            s(Some(6), 1200, 0, 100.),
        ]);
        assert_eq!(a.n_samples, 4);
        assert_eq!(a.peak_process_memory_bytes, Some(7));
        assert_eq!(a.sm_clock_mhz_median, Some((1755. + 1980.) / 2.));
        assert_eq!(a.utilization_percent_median, Some(92.5));
        assert_eq!(a.power_watts_mean, Some(400.));
        assert_eq!(GpuActivity::of(&[]), GpuActivity::default());
    }
}
