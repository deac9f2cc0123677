//! Facts about the machine a run happened on, recorded in every log header.

use candle_core::Device;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
    pub compute_capability: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HostInfo {
    pub hostname: String,
    pub os: String,
    pub cpu: String,
    pub n_cpus: usize,
    /// GPUs the run used.
    pub gpus: Vec<GpuInfo>,
    /// NVIDIA kernel driver version (`/proc/driver/nvidia/version`), if a driver is loaded.
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports (cuDriverGetVersion), e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    /// The CUDA toolkit the binary was built against, for CUDA builds.
    pub cuda_build_version: Option<String>,
}

impl HostInfo {
    pub fn collect(device: &Device) -> Self {
        Self {
            hostname: gethostname::gethostname().to_string_lossy().into_owned(),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            cpu: cpu_model().unwrap_or_else(|| "unknown".into()),
            n_cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            gpus: gpus(device),
            driver_version: nvidia_driver_version(),
            cuda_driver_version: cuda_driver_version(device),
            cuda_build_version: option_env!("CUDARC_CUDA_VERSION").map(cuda_version_string),
        }
    }
}

fn cuda_version_string(v: &str) -> String {
    // "13000" -> "13.0"
    v.parse::<u32>()
        .map(|n| format!("{}.{}", n / 1000, (n % 1000) / 10))
        .unwrap_or_else(|_| v.to_string())
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

fn nvidia_driver_version() -> Option<String> {
    parse_driver_version(&std::fs::read_to_string("/proc/driver/nvidia/version").ok()?)
}

/// The first dotted number of the NVRM line: "NVRM version: NVIDIA UNIX x86_64 Kernel Module
/// 580.159.04 …" and "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 …"
/// (the open kernel module's wording) both give "580.159.04".
fn parse_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM"))?;
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

#[cfg(feature = "cuda")]
fn gpus(device: &Device) -> Vec<GpuInfo> {
    let Device::Cuda(d) = device else {
        return vec![];
    };
    let stream = d.cuda_stream();
    let ctx = stream.context();
    vec![GpuInfo {
        index: ctx.ordinal(),
        name: ctx.name().unwrap_or_else(|e| format!("unknown ({e:?})")),
        memory_bytes: ctx.total_mem().map(|m| m as u64).unwrap_or(0),
        compute_capability: ctx
            .compute_capability()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_default(),
    }]
}

#[cfg(not(feature = "cuda"))]
fn gpus(_device: &Device) -> Vec<GpuInfo> {
    vec![]
}

#[cfg(feature = "cuda")]
fn cuda_driver_version(device: &Device) -> Option<String> {
    use candle_core::cuda::cudarc::driver::sys;
    if !device.is_cuda() {
        return None;
    }
    let mut v: std::ffi::c_int = 0;
    // SAFETY: cuDriverGetVersion writes one int; the driver is initialised (a device is open).
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().ok()?;
    Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
}

#[cfg(not(feature = "cuda"))]
fn cuda_driver_version(_device: &Device) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::parse_driver_version;

    #[test]
    fn driver_version_from_both_kernel_module_wordings() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0\n";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Tue Oct 28 2025\n";
        assert_eq!(
            parse_driver_version(proprietary).as_deref(),
            Some("535.104.05")
        );
        assert_eq!(parse_driver_version(open).as_deref(), Some("580.159.04"));
        assert_eq!(parse_driver_version("garbage"), None);
    }
}
