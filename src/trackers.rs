//! Small start/stop trackers that suites use to measure (as optimum-benchmark's trackers):
//! latency of a device region, peak memory of the run (the engine's own count), and from NVML
//! ([`GpuSampler`], [`EnergyTracker`]) what the driver sees: the process's device memory,
//! clocks, utilisation, power and energy.

use crate::device::synchronize;
use crate::env::nvml_error;
use crate::error::{Error, Result};
use candle_core::Device;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
/// driver's: the engine's pool high-water ([`MemoryTracker`]) plus the CUDA context and loaded
/// kernels (~0.5 GiB on an H100), cuBLAS workspaces, and what the pool reserved but is not
/// using (freed blocks it keeps, allocation granularity).
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

/// Energy of a region from NVML's total-energy counter.
pub struct EnergyTracker {
    gpu: NvmlGpu,
    start_mj: u64,
    start: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EnergyReading {
    pub joules: f64,
    /// Wall time between start and stop.
    pub seconds: f64,
}

impl EnergyTracker {
    pub fn start(gpu: &NvmlGpu) -> Result<Self> {
        Ok(Self {
            start_mj: gpu.energy_mj()?,
            gpu: gpu.clone(),
            start: Instant::now(),
        })
    }

    pub fn stop(self) -> Result<EnergyReading> {
        let end = self.gpu.energy_mj()?;
        Ok(EnergyReading {
            joules: end.saturating_sub(self.start_mj) as f64 / 1e3,
            seconds: self.start.elapsed().as_secs_f64(),
        })
    }
}

/// `bench env --check-trackers`: the trackers against work of known size, as text.
#[cfg(not(feature = "cuda"))]
pub fn check_trackers(_device: crate::device::DeviceSpec) -> Result<String> {
    Err(Error::Unsupported(
        "--check-trackers checks the GPU trackers: it needs a CUDA build (`--features cuda`)"
            .into(),
    ))
}

/// `bench env --check-trackers`: the trackers against work of known size, as text.
/// 1. Memory: a 1 GiB tensor must raise NVML's process memory and the pool's high-water mark
///    by 1 GiB, give or take the pool's granularity (64 MiB allowed).
/// 2. Energy: a ~5 s bf16 8192³ matmul loop; the energy counter's joules must be within 10%
///    of sampled mean power × time. Also reports the loop's TFLOP/s and MFU.
#[cfg(feature = "cuda")]
pub fn check_trackers(spec: crate::device::DeviceSpec) -> Result<String> {
    use candle_core::{DType, Tensor};
    let crate::device::DeviceSpec::Cuda(ordinal) = spec else {
        return Err(Error::Config(
            "--check-trackers needs --device cuda[:N]".into(),
        ));
    };
    let device = spec.open()?;
    let env = crate::env::EnvReport::collect();
    let uuid = crate::device::cuda_uuid(&device);
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let index = crate::env::nvml_index(ordinal, uuid.as_deref(), visible.as_deref(), &env.gpus)
        .ok_or_else(|| Error::Unsupported(format!("no NVML GPU for cuda:{ordinal}")))?;
    let name = env
        .gpus
        .iter()
        .find(|g| g.index == index)
        .map(|g| g.name.clone())
        .unwrap_or_default();
    let gpu = NvmlGpu::open(index, std::process::id())?;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    let settle = || std::thread::sleep(Duration::from_millis(300));
    let mut out = format!(
        "check-trackers on cuda:{ordinal} = NVML GPU {index} ({name}), pid {}\n",
        gpu.pid
    );

    // Warm-up: context, cuBLAS handle, kernels and the pool exist before the baseline.
    {
        let w = Tensor::ones((1024, 1024), DType::BF16, &device)?;
        w.matmul(&w)?;
    }
    synchronize(&device)?;
    settle();
    let base = gpu.sample();
    let memory = MemoryTracker::start(&device)?;
    let one_gib = Tensor::zeros(1usize << 28, DType::F32, &device)?; // 2^28 f32 = 1 GiB
    synchronize(&device)?;
    settle();
    let after = gpu.sample();
    let pool = memory.read()?;
    drop(one_gib);
    let delta = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a as f64 - b as f64),
        _ => None,
    };
    let within = |d: Option<f64>| d.is_some_and(|d| (mib(d) - 1024.).abs() <= 64.);
    let nvml_delta = delta(after.process_memory_bytes, base.process_memory_bytes);
    let dev_delta = delta(
        after.device_memory_used_bytes,
        base.device_memory_used_bytes,
    );
    out += &format!(
        "memory: baseline NVML process {:.1} MiB (context + cuBLAS + kernels), device used {:.1} MiB\n",
        mib(base.process_memory_bytes.unwrap_or(0) as f64),
        mib(base.device_memory_used_bytes.unwrap_or(0) as f64)
    );
    out += &format!(
        "memory: +1024 MiB tensor -> NVML process {} MiB, NVML device used {} MiB, pool used high {:.1} MiB, pool reserved high {:.1} MiB: {}\n",
        nvml_delta.map_or("n/a (pid not listed)".into(), |d| format!("{:+.1}", mib(d))),
        dev_delta.map_or("n/a".into(), |d| format!("{:+.1}", mib(d))),
        mib(pool.peak_bytes as f64),
        mib(pool.pool_reserved_bytes.unwrap_or(0) as f64),
        if (within(nvml_delta) || (nvml_delta.is_none() && within(dev_delta)))
            && within(Some(pool.peak_bytes as f64))
        {
            "PASS"
        } else {
            "FAIL"
        }
    );

    // Energy: a matmul loop of known FLOPs.
    let n = 8192usize;
    let a = Tensor::randn(0f32, 1., (n, n), &device)?.to_dtype(DType::BF16)?;
    for _ in 0..5 {
        a.matmul(&a)?;
    }
    synchronize(&device)?;
    let sampler = GpuSampler::start(gpu.clone(), Duration::from_millis(20));
    let energy = EnergyTracker::start(&gpu)?;
    let t = Instant::now();
    let mut count = 0usize;
    while t.elapsed() < Duration::from_secs(5) {
        for _ in 0..20 {
            a.matmul(&a)?;
        }
        synchronize(&device)?;
        count += 20;
    }
    let secs = t.elapsed().as_secs_f64();
    let e = energy.stop()?;
    let act = sampler.stop();
    let tflops = count as f64 * 2. * (n as f64).powi(3) / secs / 1e12;
    let peak = crate::flops::peak_tflops(&name, crate::device::Precision::Bf16);
    let expected = act.power_watts_mean.map(|w| w * e.seconds);
    let ratio = expected.map(|x| e.joules / x);
    out += &format!(
        "energy: {count} bf16 {n}³ matmuls in {secs:.2} s = {tflops:.1} TFLOP/s (MFU {}); counter {:.1} J over {:.2} s; mean sampled power {} x time = {} J; ratio {}: {}\n",
        peak.map_or("n/a".into(), |p| format!("{:.3}", tflops / p)),
        e.joules,
        e.seconds,
        act.power_watts_mean.map_or("n/a".into(), |w| format!("{w:.1} W")),
        expected.map_or("n/a".into(), |x| format!("{x:.1}")),
        ratio.map_or("n/a".into(), |r| format!("{r:.3}")),
        if ratio.is_some_and(|r| (r - 1.).abs() <= 0.1) { "PASS" } else { "FAIL" }
    );
    out += &format!(
        "clocks: {} samples, median SM clock {} MHz, median utilisation {} %\n",
        act.n_samples,
        act.sm_clock_mhz_median
            .map_or("n/a".into(), |c| format!("{c:.0}")),
        act.utilization_percent_median
            .map_or("n/a".into(), |u| format!("{u:.0}")),
    );
    Ok(out)
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
