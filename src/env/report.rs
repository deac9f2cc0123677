//! The report's types, which are also the `env` object of every log header: [`EnvReport`],
//! one [`GpuInfo`] per GPU, [`P2pLink`], [`LibraryInfo`], [`NcclInfo`], and the [`Problem`]s
//! that `diagnose` found.
//!
//! Serde: the fields that schema-1 logs had (`hostname`, `os`, `cpu`, `n_cpus`, `gpus[].{index,
//! name, memory_bytes, compute_capability}`, `driver_version`, `cuda_driver_version`,
//! `cuda_build_version`) keep their names; the rest default when absent, so old logs still read.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    /// NVML index (PCI bus order; not renumbered by CUDA_VISIBLE_DEVICES).
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
    pub compute_capability: String,
    #[serde(default)]
    pub uuid: Option<String>,
    /// MIG mode currently on; None where the GPU has no MIG.
    #[serde(default)]
    pub mig_enabled: Option<bool>,
    #[serde(default)]
    pub sm_clock_mhz: Option<u32>,
    #[serde(default)]
    pub sm_clock_max_mhz: Option<u32>,
    #[serde(default)]
    pub memory_clock_mhz: Option<u32>,
    #[serde(default)]
    pub memory_clock_max_mhz: Option<u32>,
    /// Enforced power limit, watts.
    #[serde(default)]
    pub power_limit_watts: Option<f64>,
    #[serde(default)]
    pub pcie_gen: Option<u32>,
    #[serde(default)]
    pub pcie_width: Option<u32>,
    #[serde(default)]
    pub pcie_gen_max: Option<u32>,
    #[serde(default)]
    pub pcie_width_max: Option<u32>,
    /// Active NVLink links (0 on PCIe-only GPUs; None where NVML cannot tell).
    #[serde(default)]
    pub nvlink_active_links: Option<u32>,
}

/// Peer access from one GPU to another (`nvmlDeviceGetP2PStatus`), as NVML words it:
/// `ok`, `not_supported`, `chipset_not_supported`, `gpu_not_supported`,
/// `ioh_topology_not_supported`, `disabled_by_regkey`, `unknown` or `error: …`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct P2pLink {
    pub from: usize,
    pub to: usize,
    pub read: String,
    pub write: String,
    pub nvlink: String,
}

/// One shared library the binary uses, found (or not) as the dynamic loader would.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LibraryInfo {
    /// `libcuda`, `libcudart`, `libcublas`, `libcublasLt`, `libcurand`, `libnccl`.
    pub name: String,
    /// The sonames tried, in order.
    pub sonames: Vec<String>,
    /// The built features need it: missing means `bench` cannot run on the GPU.
    pub needed: bool,
    /// Version through the library's own API (`cuDriverGetVersion`, `cudaRuntimeGetVersion`,
    /// `cublasGetProperty`, `cublasLtGetVersion`, `curandGetVersion`, `ncclGetVersion`).
    pub version: Option<String>,
    /// The file it was loaded from (dladdr of the version symbol).
    pub path: Option<String>,
    /// Why it was not loaded (the loader's message).
    pub error: Option<String>,
}

impl LibraryInfo {
    pub fn found(&self) -> bool {
        self.path.is_some() || self.version.is_some()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NcclInfo {
    pub version: String,
    /// bf16 reductions and `ncclAvg` arrived in NCCL 2.10.
    pub bf16_and_avg: bool,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing is wrong.
    Note,
    /// Runs, but slower or not comparable.
    Warning,
    /// Something the built features need is missing: `bench env` exits non-zero.
    Error,
}

/// A known problem and what to do about it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Problem {
    pub severity: Severity,
    pub what: String,
    pub fix: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EnvReport {
    pub hostname: String,
    pub os: String,
    #[serde(default)]
    pub kernel: Option<String>,
    pub cpu: String,
    pub n_cpus: usize,
    /// Physical RAM (MemTotal).
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Cargo features this binary was built with (`cuda`, `report`).
    #[serde(default)]
    pub build_features: Vec<String>,
    /// The CUDA toolkit the binary was built against (CUDA builds only), e.g. "13.0".
    pub cuda_build_version: Option<String>,
    /// NVIDIA driver version (NVML), e.g. "580.159.04".
    pub driver_version: Option<String>,
    /// Highest CUDA the driver supports (NVML), e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    /// Why NVML gave no facts (no driver, no GPU), if it did not.
    #[serde(default)]
    pub nvml_error: Option<String>,
    /// Every GPU NVML sees (a run's own GPU: the header's `gpu_index`, see
    /// [`nvml_index`](super::nvml_index)).
    pub gpus: Vec<GpuInfo>,
    /// Peer access between every ordered pair of GPUs.
    #[serde(default)]
    pub p2p: Vec<P2pLink>,
    #[serde(default)]
    pub libraries: Vec<LibraryInfo>,
    #[serde(default)]
    pub nccl: Option<NcclInfo>,
    /// [`diagnose`](super::diagnose())'s findings at collection time.
    #[serde(default)]
    pub problems: Vec<Problem>,
}

impl EnvReport {
    /// Whether a problem is an error (something the built features need is missing).
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(|p| p.severity == Severity::Error)
    }

    /// The GPU with this NVML index.
    pub fn gpu(&self, index: usize) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| g.index == index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_1_headers_still_read() {
        let old = r#"{"hostname":"vm","os":"linux x86_64","cpu":"Xeon","n_cpus":16,"gpus":[{"index":0,"name":"NVIDIA H100 80GB HBM3","memory_bytes":85017493504,"compute_capability":"9.0"}],"driver_version":"580.159.04","cuda_driver_version":"13.0","cuda_build_version":"13.0"}"#;
        let r: EnvReport = serde_json::from_str(old).unwrap();
        assert_eq!(r.gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert!(r.libraries.is_empty() && r.problems.is_empty());
    }
}
