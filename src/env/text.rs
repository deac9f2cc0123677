//! The one-screen text of `bench env` ([`EnvReport::to_text`]): host, build and driver lines,
//! two lines per GPU, the peer-access matrix (more than one GPU), the libraries, NCCL, and the
//! problems with their hints. `-` marks a fact that could not be read.

use super::report::{EnvReport, GpuInfo, LibraryInfo, NcclInfo, Problem, Severity};

impl EnvReport {
    /// The one-screen text of `bench env`.
    pub fn to_text(&self) -> String {
        let mut t = self.host_lines();
        for g in &self.gpus {
            t += &gpu_lines(g);
        }
        if self.gpus.len() > 1 {
            t += &self.p2p_matrix();
        }
        t += "libraries\n";
        for l in &self.libraries {
            t += &library_line(l);
        }
        t += &nccl_line(self.nccl.as_ref());
        if self.problems.is_empty() {
            t += "problems  none\n";
        }
        for p in &self.problems {
            t += &problem_lines(p);
        }
        t
    }

    /// The `host`, `build` and `driver` lines.
    fn host_lines(&self) -> String {
        let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        let mut t = String::new();
        t += &format!(
            "host      {} | {} {} | {} ({} CPUs) | RAM {}\n",
            self.hostname,
            self.os,
            self.kernel.as_deref().unwrap_or(""),
            self.cpu,
            self.n_cpus,
            self.memory_bytes
                .map(|b| format!("{:.1} GiB", gib(b)))
                .unwrap_or_else(|| "-".into())
        );
        t += &format!(
            "build     features [{}], CUDA {}\n",
            self.build_features.join(", "),
            self.cuda_build_version
                .as_deref()
                .unwrap_or("- (CPU build)")
        );
        match &self.nvml_error {
            Some(_) => t += "driver    no NVIDIA driver / GPU found (details below)\n",
            None => {
                t += &format!(
                    "driver    {} (supports CUDA up to {})\n",
                    opt(&self.driver_version),
                    opt(&self.cuda_driver_version)
                )
            }
        }
        t
    }

    /// Peer read access, one row per source GPU: `OK`, `NV` (over NVLink), or `--` and the
    /// status word below the table.
    fn p2p_matrix(&self) -> String {
        let n = self.gpus.len();
        let mut t = String::from("p2p read  ");
        t += &(0..n).map(|j| format!("{j:>5}")).collect::<String>();
        t += "\n";
        for i in 0..n {
            t += &format!("  gpu {i:<4}");
            for j in 0..n {
                let cell = if i == j {
                    "X".to_string()
                } else {
                    match self.p2p.iter().find(|l| l.from == i && l.to == j) {
                        Some(l) if l.read == "ok" && l.nvlink == "ok" => "NV".into(),
                        Some(l) if l.read == "ok" => "OK".into(),
                        Some(_) => "--".into(),
                        None => "?".into(),
                    }
                };
                t += &format!("{cell:>5}");
            }
            t += "\n";
        }
        t
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn num(v: Option<u32>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Current/max clock.
fn mhz(c: Option<u32>, m: Option<u32>) -> String {
    match (c, m) {
        (Some(c), Some(m)) => format!("{c}/{m} MHz"),
        (Some(c), None) => format!("{c} MHz"),
        _ => "-".into(),
    }
}

/// Two lines: identity, then clocks, power and links.
fn gpu_lines(g: &GpuInfo) -> String {
    let mut t = format!(
        "gpu {}     {} | {} | {:.1} GiB | sm_{} | MIG {}\n",
        g.index,
        g.name,
        g.uuid.as_deref().unwrap_or("-"),
        gib(g.memory_bytes),
        g.compute_capability.replace('.', ""),
        match g.mig_enabled {
            Some(true) => "on",
            Some(false) => "off",
            None => "n/a",
        }
    );
    t += &format!(
        "          SM {} | mem {} | power limit {} | PCIe gen {} x{} (max gen {} x{}) | NVLink links {}\n",
        mhz(g.sm_clock_mhz, g.sm_clock_max_mhz),
        mhz(g.memory_clock_mhz, g.memory_clock_max_mhz),
        g.power_limit_watts
            .map(|w| format!("{w:.0} W"))
            .unwrap_or_else(|| "-".into()),
        num(g.pcie_gen),
        num(g.pcie_width),
        num(g.pcie_gen_max),
        num(g.pcie_width_max),
        num(g.nvlink_active_links),
    );
    t
}

fn library_line(l: &LibraryInfo) -> String {
    let what = match (&l.version, &l.path) {
        (Some(v), Some(p)) => format!("{v:<10} {p}"),
        (Some(v), None) => v.to_string(),
        (None, Some(p)) => format!("{:<10} {p}", "?"),
        (None, None) => format!("not found ({})", l.sonames.join(", ")),
    };
    let need = if l.needed { "needed" } else { "optional" };
    format!("  {:<12} {need:<8} {what}\n", l.name)
}

fn nccl_line(nccl: Option<&NcclInfo>) -> String {
    match nccl {
        Some(n) => format!(
            "nccl      {} | bf16 + ncclAvg: {}\n",
            n.version,
            if n.bf16_and_avg {
                "yes"
            } else {
                "no (needs >= 2.10)"
            }
        ),
        None => "nccl      not found (needed by --tp on GPUs only)\n".into(),
    }
}

fn problem_lines(p: &Problem) -> String {
    let tag = match p.severity {
        Severity::Note => "note",
        Severity::Warning => "warning",
        Severity::Error => "ERROR",
    };
    format!("{tag}: {}\n  hint: {}\n", p.what, p.fix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{diagnose, P2pLink};

    fn lib(name: &str, needed: bool, version: Option<&str>, path: Option<&str>) -> LibraryInfo {
        LibraryInfo {
            name: name.into(),
            sonames: vec![format!("{name}.so.13"), format!("{name}.so.12")],
            needed,
            version: version.map(Into::into),
            path: path.map(Into::into),
            error: None,
        }
    }

    fn link(from: usize, to: usize, read: &str, nvlink: &str) -> P2pLink {
        P2pLink {
            from,
            to,
            read: read.into(),
            write: read.into(),
            nvlink: nvlink.into(),
        }
    }

    /// Every field read; MIG on with some clocks missing; unreadable.
    fn three_gpus() -> Vec<GpuInfo> {
        let full = GpuInfo {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 85_520_809_984,
            compute_capability: "9.0".into(),
            uuid: Some("GPU-0a1b".into()),
            mig_enabled: Some(false),
            sm_clock_mhz: Some(1980),
            sm_clock_max_mhz: Some(1980),
            memory_clock_mhz: Some(2619),
            memory_clock_max_mhz: Some(2619),
            power_limit_watts: Some(699.5),
            pcie_gen: Some(5),
            pcie_width: Some(16),
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            nvlink_active_links: Some(18),
        };
        let mig = GpuInfo {
            index: 1,
            mig_enabled: Some(true),
            sm_clock_max_mhz: None,
            memory_clock_mhz: None,
            power_limit_watts: None,
            ..full.clone()
        };
        let bare = GpuInfo {
            index: 2,
            name: "unreadable (Unknown Error)".into(),
            ..Default::default()
        };
        vec![full, mig, bare]
    }

    /// Old driver, newer runtime, a missing library, old NCCL, no peer access, MIG.
    fn troubled_report() -> EnvReport {
        EnvReport {
            hostname: "node7".into(),
            os: "linux x86_64 (Ubuntu 24.04.2 LTS)".into(),
            kernel: Some("6.8.0-60-generic".into()),
            cpu: "Intel(R) Xeon(R) Platinum 8480+".into(),
            n_cpus: 16,
            memory_bytes: Some(135_089_856_512),
            build_features: vec!["cuda".into(), "report".into()],
            cuda_build_version: Some("13.0".into()),
            driver_version: Some("550.54.15".into()),
            cuda_driver_version: Some("12.4".into()),
            gpus: three_gpus(),
            p2p: vec![
                link(0, 1, "ok", "ok"),
                link(1, 0, "ok", "not_supported"),
                link(0, 2, "not_supported", "not_supported"),
                link(2, 0, "not_supported", "not_supported"),
                link(2, 1, "error: Unknown Error", "error: Unknown Error"),
            ],
            libraries: vec![
                lib(
                    "libcuda",
                    true,
                    Some("12.4"),
                    Some("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
                ),
                lib(
                    "libcudart",
                    true,
                    Some("13.1"),
                    Some("/opt/cu13/libcudart.so.13.1.80"),
                ),
                lib("libcublas", true, Some("13.1.0"), None),
                lib("libcublasLt", true, None, None),
                lib("libcurand", false, None, None),
                lib("libnccl", false, None, Some("/usr/lib/libnccl.so.2")),
            ],
            nccl: Some(NcclInfo {
                version: "2.8.4".into(),
                bf16_and_avg: false,
            }),
            ..Default::default()
        }
    }

    /// Reports that reach every line and every problem the text can show: troubled, CPU-only
    /// without a driver, a CUDA build whose driver sees no GPU, and a healthy two-GPU host.
    fn golden_reports() -> Vec<EnvReport> {
        let cpu = EnvReport {
            hostname: "laptop".into(),
            os: "linux aarch64".into(),
            cpu: "unknown".into(),
            n_cpus: 1,
            nvml_error: Some("libnvidia-ml.so.1: cannot open shared object file".into()),
            ..Default::default()
        };
        let no_gpu = EnvReport {
            build_features: vec!["cuda".into()],
            cuda_build_version: Some("12.9".into()),
            driver_version: Some("575.51.03".into()),
            cuda_driver_version: Some("12.8".into()),
            libraries: vec![
                lib("libcuda", true, None, None),
                lib(
                    "libcudart",
                    false,
                    Some("12.9"),
                    Some("/usr/local/cuda/lib64/libcudart.so.12"),
                ),
            ],
            ..Default::default()
        };
        let healthy = EnvReport {
            gpus: vec![bare_gpu(0), bare_gpu(1)],
            nccl: Some(NcclInfo {
                version: "2.28.9".into(),
                bf16_and_avg: true,
            }),
            ..Default::default()
        };
        let mut reports = vec![troubled_report(), cpu, no_gpu];
        for r in &mut reports {
            r.problems = diagnose(r);
        }
        reports.push(healthy);
        reports
    }

    fn bare_gpu(index: usize) -> GpuInfo {
        GpuInfo {
            index,
            ..Default::default()
        }
    }

    fn golden_text() -> String {
        golden_reports()
            .iter()
            .map(|r| r.to_text())
            .collect::<Vec<_>>()
            .join("----\n")
    }

    /// The text of [`golden_reports`], as the single-function `to_text` and `diagnose` before
    /// the split into helpers wrote it (captured from commit 33f566c).
    const GOLDEN: &str = r#"host      node7 | linux x86_64 (Ubuntu 24.04.2 LTS) 6.8.0-60-generic | Intel(R) Xeon(R) Platinum 8480+ (16 CPUs) | RAM 125.8 GiB
build     features [cuda, report], CUDA 13.0
driver    550.54.15 (supports CUDA up to 12.4)
gpu 0     NVIDIA H100 80GB HBM3 | GPU-0a1b | 79.6 GiB | sm_90 | MIG off
          SM 1980/1980 MHz | mem 2619/2619 MHz | power limit 700 W | PCIe gen 5 x16 (max gen 5 x16) | NVLink links 18
gpu 1     NVIDIA H100 80GB HBM3 | GPU-0a1b | 79.6 GiB | sm_90 | MIG on
          SM 1980 MHz | mem - | power limit - | PCIe gen 5 x16 (max gen 5 x16) | NVLink links 18
gpu 2     unreadable (Unknown Error) | - | 0.0 GiB | sm_ | MIG n/a
          SM - | mem - | power limit - | PCIe gen - x- (max gen - x-) | NVLink links -
p2p read      0    1    2
  gpu 0       X   NV   --
  gpu 1      OK    X    ?
  gpu 2      --   --    X
libraries
  libcuda      needed   12.4       /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
  libcudart    needed   13.1       /opt/cu13/libcudart.so.13.1.80
  libcublas    needed   13.1.0
  libcublasLt  needed   not found (libcublasLt.so.13, libcublasLt.so.12)
  libcurand    optional not found (libcurand.so.13, libcurand.so.12)
  libnccl      optional ?          /usr/lib/libnccl.so.2
nccl      2.8.4 | bf16 + ncclAvg: no (needs >= 2.10)
ERROR: the driver 550.54.15 supports CUDA up to 12.4, this binary was built for CUDA 13.0
  hint: upgrade the NVIDIA driver to one supporting CUDA 13.0 (>= 580.65.06), or rebuild with a CUDA 12.4 toolkit (CUDARC_CUDA_VERSION=12040)
ERROR: libcudart 13.1 (from /opt/cu13/libcudart.so.13.1.80) is newer than the driver's CUDA 12.4
  hint: upgrade the driver, or put a CUDA 12.4 runtime first on LD_LIBRARY_PATH
ERROR: libcublasLt not found (libcublasLt.so.13, libcublasLt.so.12)
  hint: set LD_LIBRARY_PATH to the directory holding libcublasLt.so.13 or libcublasLt.so.12 (e.g. /usr/local/cuda/lib64, or a pip wheel's nvidia/cu13/lib)
warning: NCCL 2.8.4 has no bf16 reductions and no ncclAvg (needs >= 2.10)
  hint: put a newer libnccl.so.2 first on LD_LIBRARY_PATH (e.g. pip nvidia-nccl-cu13: its nvidia/nccl/lib)
warning: no peer access GPU 0 -> GPU 2 (not_supported)
  hint: tensor parallelism across these GPUs goes through host memory: expect slow TP (check `nvidia-smi topo -m`, IOMMU/ACS settings)
warning: no peer access GPU 2 -> GPU 1 (error: Unknown Error)
  hint: tensor parallelism across these GPUs goes through host memory: expect slow TP (check `nvidia-smi topo -m`, IOMMU/ACS settings)
warning: GPU 1 (NVIDIA H100 80GB HBM3) is in MIG mode
  hint: a MIG slice has a fraction of the SMs and memory: results are not comparable with a whole GPU
----
host      laptop | linux aarch64  | unknown (1 CPUs) | RAM -
build     features [], CUDA - (CPU build)
driver    no NVIDIA driver / GPU found (details below)
libraries
nccl      not found (needed by --tp on GPUs only)
note: no NVIDIA driver / GPU found (NVML: libnvidia-ml.so.1: cannot open shared object file)
  hint: CPU-only: fine for this build (it has no `cuda` feature)
----
host       |   |  (0 CPUs) | RAM -
build     features [cuda], CUDA 12.9
driver    575.51.03 (supports CUDA up to 12.8)
libraries
  libcuda      needed   not found (libcuda.so.13, libcuda.so.12)
  libcudart    optional 12.9       /usr/local/cuda/lib64/libcudart.so.12
nccl      not found (needed by --tp on GPUs only)
ERROR: the NVIDIA driver is loaded but reports no GPU
  hint: check CUDA_VISIBLE_DEVICES, the container's --gpus, and `dmesg` for Xid errors
ERROR: the driver 575.51.03 supports CUDA up to 12.8, this binary was built for CUDA 12.9
  hint: upgrade the NVIDIA driver to one supporting CUDA 12.9 (>= 575.51.03), or rebuild with a CUDA 12.8 toolkit (CUDARC_CUDA_VERSION=12080)
ERROR: libcuda not found (libcuda.so.13, libcuda.so.12)
  hint: libcuda.so.1 comes with the NVIDIA driver: install the driver, or in a container mount it (NVIDIA container toolkit)
warning: libcudart 12.9 (from /usr/local/cuda/lib64/libcudart.so.12) is newer than the driver's CUDA 12.8
  hint: upgrade the driver, or put a CUDA 12.8 runtime first on LD_LIBRARY_PATH
----
host       |   |  (0 CPUs) | RAM -
build     features [], CUDA - (CPU build)
driver    - (supports CUDA up to -)
gpu 0      | - | 0.0 GiB | sm_ | MIG n/a
          SM - | mem - | power limit - | PCIe gen - x- (max gen - x-) | NVLink links -
gpu 1      | - | 0.0 GiB | sm_ | MIG n/a
          SM - | mem - | power limit - | PCIe gen - x- (max gen - x-) | NVLink links -
p2p read      0    1
  gpu 0       X    ?
  gpu 1       ?    X
libraries
nccl      2.28.9 | bf16 + ncclAvg: yes
problems  none
"#;

    #[test]
    fn text_of_every_line_and_problem_is_unchanged() {
        let text = golden_text();
        for (got, want) in text.lines().zip(GOLDEN.lines()) {
            assert_eq!(got, want);
        }
        assert_eq!(text, GOLDEN);
    }
}
