//! `bench env --check-trackers`: the GPU trackers measured against work of known size (a 1 GiB
//! tensor, a matmul loop of known FLOPs), as text with PASS / FAIL per check. CUDA builds only;
//! a CPU build says which feature it needs.

use crate::error::{Error, Result};

/// `bench env --check-trackers`: the trackers against work of known size, as text.
#[cfg(not(feature = "cuda"))]
pub fn check_trackers(_device: crate::device::DeviceSpec) -> Result<String> {
    Err(Error::Unsupported(
        "--check-trackers checks the GPU trackers: it needs a CUDA build (`--features cuda`)"
            .into(),
    ))
}

#[cfg(feature = "cuda")]
pub use gpu::check_trackers;

#[cfg(feature = "cuda")]
mod gpu {
    use super::{Error, Result};
    use crate::device::synchronize;
    use crate::trackers::{EnergyTracker, GpuSampler, MemoryTracker, NvmlGpu};
    use candle_core::{DType, Device, Tensor};
    use std::time::{Duration, Instant};

    fn mib(b: f64) -> f64 {
        b / (1u64 << 20) as f64
    }

    /// `bench env --check-trackers`: the trackers against work of known size, as text.
    /// 1. Memory: a 1 GiB tensor must raise NVML's process memory and the pool's high-water mark
    ///    by 1 GiB, give or take the pool's granularity (64 MiB allowed).
    /// 2. Energy: a ~5 s bf16 8192³ matmul loop; the energy counter's joules must be within 10%
    ///    of sampled mean power × time. Also reports the loop's TFLOP/s and MFU.
    pub fn check_trackers(spec: crate::device::DeviceSpec) -> Result<String> {
        let crate::device::DeviceSpec::Cuda(ordinal) = spec else {
            return Err(Error::Config(
                "--check-trackers needs --device cuda[:N]".into(),
            ));
        };
        let device = spec.open()?;
        let (index, name) = nvml_gpu_of(ordinal, &device)?;
        let gpu = NvmlGpu::open(index, std::process::id())?;
        let mut out = format!(
            "check-trackers on cuda:{ordinal} = NVML GPU {index} ({name}), pid {}\n",
            gpu.pid
        );
        out += &check_memory(&device, &gpu)?;
        out += &check_energy(&device, &gpu, &name)?;
        Ok(out)
    }

    /// The NVML index and name of CUDA device `ordinal`.
    fn nvml_gpu_of(ordinal: usize, device: &Device) -> Result<(usize, String)> {
        let env = crate::env::EnvReport::collect();
        let uuid = crate::device::cuda_uuid(device);
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let index = crate::env::nvml_index(ordinal, uuid.as_deref(), visible.as_deref(), &env.gpus)
            .ok_or_else(|| Error::Unsupported(format!("no NVML GPU for cuda:{ordinal}")))?;
        let name = env
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.name.clone())
            .unwrap_or_default();
        Ok((index, name))
    }

    /// The memory lines: NVML's process memory and the pool's high-water mark around a
    /// 1 GiB tensor.
    fn check_memory(device: &Device, gpu: &NvmlGpu) -> Result<String> {
        let settle = || std::thread::sleep(Duration::from_millis(300));
        // Warm-up: context, cuBLAS handle, kernels and the pool exist before the baseline.
        {
            let w = Tensor::ones((1024, 1024), DType::BF16, device)?;
            w.matmul(&w)?;
        }
        synchronize(device)?;
        settle();
        let base = gpu.sample();
        let memory = MemoryTracker::start(device)?;
        let one_gib = Tensor::zeros(1usize << 28, DType::F32, device)?; // 2^28 f32 = 1 GiB
        synchronize(device)?;
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
        let mut out = format!(
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
        Ok(out)
    }

    /// `count` bf16 `n`³ matmuls, in batches of 20, for about 5 s; returns (count, seconds).
    fn matmul_loop(device: &Device, a: &Tensor) -> Result<(usize, f64)> {
        let t = Instant::now();
        let mut count = 0usize;
        while t.elapsed() < Duration::from_secs(5) {
            for _ in 0..20 {
                a.matmul(a)?;
            }
            synchronize(device)?;
            count += 20;
        }
        Ok((count, t.elapsed().as_secs_f64()))
    }

    /// The energy and clock lines: the energy counter against sampled power × time over a
    /// matmul loop of known FLOPs.
    fn check_energy(device: &Device, gpu: &NvmlGpu, name: &str) -> Result<String> {
        let n = 8192usize;
        let a = Tensor::randn(0f32, 1., (n, n), device)?.to_dtype(DType::BF16)?;
        for _ in 0..5 {
            a.matmul(&a)?;
        }
        synchronize(device)?;
        let sampler = GpuSampler::start(gpu.clone(), Duration::from_millis(20));
        let energy = EnergyTracker::start(gpu)?;
        let (count, secs) = matmul_loop(device, &a)?;
        let e = energy.stop()?;
        let act = sampler.stop();
        let tflops = count as f64 * 2. * (n as f64).powi(3) / secs / 1e12;
        let peak = crate::flops::peak_tflops(name, crate::device::Precision::Bf16);
        let expected = act.power_watts_mean.map(|w| w * e.seconds);
        let ratio = expected.map(|x| e.joules / x);
        let mut out = format!(
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
}
