//! The environment report: `bench env` prints it and every run log's header embeds it, from one
//! collector ([`EnvReport::collect`], here).
//!
//! What it holds: host facts (OS, CPU, RAM, build features); per GPU (from NVML, never from
//! `nvidia-smi` text): name, UUID, memory, compute capability, MIG mode, clocks, power limit,
//! PCIe link, active NVLink links; the driver and the highest CUDA it supports; every CUDA
//! library the binary uses, loaded by soname the way the dynamic loader would, with the
//! version read through the library's own API and the file it loaded from; the peer-access
//! matrix; NCCL. [`diagnose()`] turns those facts into [`Problem`]s, each with a fix line.
//!
//! NVML (`libnvidia-ml.so.1`) is loaded at run time, so a machine without a driver still gets
//! a report, saying that no driver was found.
//!
//! Files: `report.rs` the serde types (the log header's schema); `probe.rs` host facts, CUDA
//! libraries and version codes; `nvml.rs` what the driver says; `diagnose.rs` known problems
//! and their fixes; `text.rs` the one-screen text; `fixtures.rs` made-up reports for the
//! tests. This module imports nothing else of the crate, so everything may use it.

mod diagnose;
#[cfg(test)]
mod fixtures;
mod nvml;
mod probe;
mod report;
mod text;

pub use diagnose::diagnose;
pub use nvml::{nvml_error, nvml_index};
pub use probe::{build_features, nccl_version, version_5, version_at_least};
pub use report::{EnvReport, GpuInfo, LibraryInfo, NcclInfo, P2pLink, Problem, Severity};

impl EnvReport {
    /// Collects everything: host, NVML, libraries, then [`diagnose()`]. Never fails: what cannot
    /// be read is None, or an error string.
    pub fn collect() -> Self {
        let mut r = Self {
            hostname: gethostname::gethostname().to_string_lossy().into_owned(),
            os: probe::os_name(),
            kernel: probe::read_trim("/proc/sys/kernel/osrelease"),
            cpu: probe::cpu_model().unwrap_or_else(|| "unknown".into()),
            n_cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            memory_bytes: probe::mem_total_bytes(),
            build_features: build_features(),
            cuda_build_version: probe::cuda_build_version(),
            ..Default::default()
        };
        match nvml::nvml_facts() {
            Ok(f) => {
                r.driver_version = Some(f.driver_version);
                r.cuda_driver_version = f.cuda_driver_version;
                r.gpus = f.gpus;
                r.p2p = f.p2p;
            }
            Err(e) => r.nvml_error = Some(e),
        }
        r.libraries = probe::probe_libraries(r.cuda_build_version.as_deref());
        r.nccl = r
            .libraries
            .iter()
            .find(|l| l.name == "libnccl")
            .and_then(|l| l.version.as_deref())
            .map(probe::nccl_info);
        r.problems = diagnose(&r);
        r
    }
}
