//! The environment report: `bench env` prints it and every run log's header embeds it, from one
//! collector ([`EnvReport::collect`]).
//!
//! What it holds: host facts (OS, CPU, RAM, build features); per GPU (from NVML, never from
//! `nvidia-smi` text): name, UUID, memory, compute capability, MIG mode, clocks, power limit,
//! PCIe link, active NVLink links; the driver and the highest CUDA it supports; every CUDA
//! library the binary uses, loaded by soname the way the dynamic loader would, with the
//! version read through the library's own API and the file it loaded from; the peer-access
//! matrix; NCCL. [`diagnose`] turns those facts into [`Problem`]s, each with a fix line.
//!
//! NVML (`libnvidia-ml.so.1`) is loaded at run time, so a machine without a driver still gets
//! a report, saying that no driver was found.
//!
//! Serde: the fields that schema-1 logs had (`hostname`, `os`, `cpu`, `n_cpus`, `gpus[].{index,
//! name, memory_bytes, compute_capability}`, `driver_version`, `cuda_driver_version`,
//! `cuda_build_version`) keep their names; the rest default when absent, so old logs still read.

use serde::{Deserialize, Serialize};
use std::ffi::{c_int, c_void, CStr};

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
    /// Every GPU NVML sees (a run's own GPU: the header's `gpu_index`, see [`nvml_index`]).
    pub gpus: Vec<GpuInfo>,
    /// Peer access between every ordered pair of GPUs.
    #[serde(default)]
    pub p2p: Vec<P2pLink>,
    #[serde(default)]
    pub libraries: Vec<LibraryInfo>,
    #[serde(default)]
    pub nccl: Option<NcclInfo>,
    /// [`diagnose`]'s findings at collection time.
    #[serde(default)]
    pub problems: Vec<Problem>,
}

impl EnvReport {
    /// Collects everything: host, NVML, libraries, then [`diagnose`]. Never fails: what cannot
    /// be read is None, or an error string.
    pub fn collect() -> Self {
        let mut r = Self {
            hostname: gethostname::gethostname().to_string_lossy().into_owned(),
            os: os_name(),
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            cpu: cpu_model().unwrap_or_else(|| "unknown".into()),
            n_cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            memory_bytes: mem_total_bytes(),
            build_features: build_features(),
            cuda_build_version: cuda_build_version(),
            ..Default::default()
        };
        match nvml_facts() {
            Ok(f) => {
                r.driver_version = Some(f.driver_version);
                r.cuda_driver_version = f.cuda_driver_version;
                r.gpus = f.gpus;
                r.p2p = f.p2p;
            }
            Err(e) => r.nvml_error = Some(e),
        }
        r.libraries = probe_libraries(r.cuda_build_version.as_deref());
        r.nccl = r
            .libraries
            .iter()
            .find(|l| l.name == "libnccl")
            .and_then(|l| l.version.as_deref())
            .map(nccl_info);
        r.problems = diagnose(&r);
        r
    }

    /// Whether a problem is an error (something the built features need is missing).
    pub fn has_errors(&self) -> bool {
        self.problems.iter().any(|p| p.severity == Severity::Error)
    }

    /// The GPU with this NVML index.
    pub fn gpu(&self, index: usize) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The one-screen text of `bench env`.
    pub fn to_text(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
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
        for g in &self.gpus {
            let mhz = |c: Option<u32>, m: Option<u32>| match (c, m) {
                (Some(c), Some(m)) => format!("{c}/{m} MHz"),
                (Some(c), None) => format!("{c} MHz"),
                _ => "-".into(),
            };
            t += &format!(
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
        }
        if self.gpus.len() > 1 {
            t += &self.p2p_matrix();
        }
        t += "libraries\n";
        for l in &self.libraries {
            let what = match (&l.version, &l.path) {
                (Some(v), Some(p)) => format!("{v:<10} {p}"),
                (Some(v), None) => v.to_string(),
                (None, Some(p)) => format!("{:<10} {p}", "?"),
                (None, None) => format!("not found ({})", l.sonames.join(", ")),
            };
            let need = if l.needed { "needed" } else { "optional" };
            t += &format!("  {:<12} {need:<8} {what}\n", l.name);
        }
        match &self.nccl {
            Some(n) => {
                t += &format!(
                    "nccl      {} | bf16 + ncclAvg: {}\n",
                    n.version,
                    if n.bf16_and_avg {
                        "yes"
                    } else {
                        "no (needs >= 2.10)"
                    }
                )
            }
            None => t += "nccl      not found (needed by --tp on GPUs only)\n",
        }
        if self.problems.is_empty() {
            t += "problems  none\n";
        }
        for p in &self.problems {
            let tag = match p.severity {
                Severity::Note => "note",
                Severity::Warning => "warning",
                Severity::Error => "ERROR",
            };
            t += &format!("{tag}: {}\n  hint: {}\n", p.what, p.fix);
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

fn num(v: Option<u32>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Cargo features compiled into this binary.
pub fn build_features() -> Vec<String> {
    let mut f = vec![];
    if cfg!(feature = "cuda") {
        f.push("cuda".to_string());
    }
    if cfg!(feature = "report") {
        f.push("report".to_string());
    }
    f
}

fn cuda_build_version() -> Option<String> {
    if !cfg!(feature = "cuda") {
        return None;
    }
    // cudarc picks its bindings from CUDARC_CUDA_VERSION (or nvcc); build.rs reruns on it.
    Some(option_env!("CUDARC_CUDA_VERSION").map_or_else(|| "unknown".into(), version_5))
}

/// CUDA's integer versions: 13000 -> "13.0", 12040 -> "12.4".
pub fn version_5(v: &str) -> String {
    v.parse::<u32>()
        .map(|n| format!("{}.{}", n / 1000, (n % 1000) / 10))
        .unwrap_or_else(|_| v.to_string())
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn os_name() -> String {
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        });
    let base = format!("{} {}", std::env::consts::OS, std::env::consts::ARCH);
    match pretty {
        Some(p) => format!("{base} ({p})"),
        None => base,
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

fn mem_total_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

// ---------------------------------------------------------------------------------------------
// NVML

struct NvmlFacts {
    driver_version: String,
    cuda_driver_version: Option<String>,
    gpus: Vec<GpuInfo>,
    p2p: Vec<P2pLink>,
}

/// NVML's error, worded for a user.
pub fn nvml_error(e: nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::LibloadingError(e) => e.to_string(),
        E::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".into(),
        E::NoPermission => "no permission to talk to the driver".into(),
        e => e.to_string(),
    }
}

fn nvml_facts() -> std::result::Result<NvmlFacts, String> {
    use nvml_wrapper::enum_wrappers::device::{Clock, P2pCapabilitiesIndex as P2p};
    let nvml = nvml_wrapper::Nvml::init().map_err(nvml_error)?;
    let driver_version = nvml.sys_driver_version().map_err(nvml_error)?;
    let cuda_driver_version = nvml
        .sys_cuda_driver_version()
        .ok()
        .map(|v| version_5(&v.to_string()));
    let count = nvml.device_count().map_err(nvml_error)?;
    let mut devices = vec![];
    let mut gpus = vec![];
    for i in 0..count {
        let d = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                gpus.push(GpuInfo {
                    index: i as usize,
                    name: format!("unreadable ({})", nvml_error(e)),
                    ..Default::default()
                });
                continue;
            }
        };
        // NVML_NVLINK_MAX_LINKS is 18; links past the GPU's count answer an error.
        let nvlinks = (0..18)
            .map(|l| d.link_wrapper_for(l).is_active())
            .take_while(|r| r.is_ok())
            .filter(|r| matches!(r, Ok(true)))
            .count() as u32;
        gpus.push(GpuInfo {
            index: i as usize,
            name: d.name().unwrap_or_else(|e| format!("unknown ({e})")),
            memory_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            compute_capability: d
                .cuda_compute_capability()
                .map(|c| format!("{}.{}", c.major, c.minor))
                .unwrap_or_default(),
            uuid: d.uuid().ok(),
            mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            sm_clock_max_mhz: d.max_clock_info(Clock::SM).ok(),
            memory_clock_mhz: d.clock_info(Clock::Memory).ok(),
            memory_clock_max_mhz: d.max_clock_info(Clock::Memory).ok(),
            power_limit_watts: d.enforced_power_limit().ok().map(|mw| mw as f64 / 1e3),
            pcie_gen: d.current_pcie_link_gen().ok(),
            pcie_width: d.current_pcie_link_width().ok(),
            pcie_gen_max: d.max_pcie_link_gen().ok(),
            pcie_width_max: d.max_pcie_link_width().ok(),
            nvlink_active_links: d.link_wrapper_for(0).is_active().ok().map(|_| nvlinks),
        });
        devices.push((i as usize, d));
    }
    let word = |r: std::result::Result<nvml_wrapper::enum_wrappers::device::P2pStatus, _>| match r {
        Ok(s) => p2p_word(s).to_string(),
        Err(e) => format!("error: {}", nvml_error(e)),
    };
    let mut p2p = vec![];
    for (i, a) in &devices {
        for (j, b) in &devices {
            if i != j {
                p2p.push(P2pLink {
                    from: *i,
                    to: *j,
                    read: word(a.p2p_status(b, P2p::Read)),
                    write: word(a.p2p_status(b, P2p::Write)),
                    nvlink: word(a.p2p_status(b, P2p::NvLink)),
                });
            }
        }
    }
    Ok(NvmlFacts {
        driver_version,
        cuda_driver_version,
        gpus,
        p2p,
    })
}

fn p2p_word(s: nvml_wrapper::enum_wrappers::device::P2pStatus) -> &'static str {
    use nvml_wrapper::enum_wrappers::device::P2pStatus as S;
    match s {
        S::Ok => "ok",
        S::ChipsetNotSupported => "chipset_not_supported",
        S::GpuNotSupported => "gpu_not_supported",
        S::IohTopologyNotSupported => "ioh_topology_not_supported",
        S::DisabledByRegkey => "disabled_by_regkey",
        S::NotSupported => "not_supported",
        S::Unknown => "unknown",
    }
}

/// The NVML index of CUDA device `ordinal`. CUDA numbers only the GPUs in
/// `CUDA_VISIBLE_DEVICES` (indices or `GPU-…` UUIDs); NVML numbers all of them. With the
/// device's UUID (a CUDA context is open) that UUID decides; else CUDA_VISIBLE_DEVICES; else
/// the same number (CUDA and NVML agree when CUDA_DEVICE_ORDER=PCI_BUS_ID or all GPUs are alike).
pub fn nvml_index(
    ordinal: usize,
    cuda_uuid: Option<&str>,
    visible: Option<&str>,
    gpus: &[GpuInfo],
) -> Option<usize> {
    if let Some(u) = cuda_uuid {
        if let Some(g) = gpus.iter().find(|g| g.uuid.as_deref() == Some(u)) {
            return Some(g.index);
        }
    }
    match visible.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => {
            let entry = v.split(',').nth(ordinal)?.trim();
            if let Ok(i) = entry.parse::<usize>() {
                return Some(i);
            }
            gpus.iter()
                .find(|g| g.uuid.as_deref().is_some_and(|u| u.starts_with(entry)))
                .map(|g| g.index)
        }
        None => Some(ordinal),
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA libraries

/// The libraries to look for: name, sonames in order, needed. Sonames follow what the CUDA
/// build links (`readelf -d bench`: libcuda.so.1, libcublas.so.13, libcudart.so.13,
/// libcurand.so.10; libcublasLt.so.13 comes in through libcublas); a CPU build tries the
/// CUDA 13 then 12 names.
fn library_specs(cuda_build: Option<&str>) -> Vec<(&'static str, Vec<String>, bool)> {
    let cuda = cfg!(feature = "cuda");
    let majors: Vec<String> = match cuda_build.and_then(|v| v.split('.').next()) {
        Some(m) if m.parse::<u32>().is_ok() => vec![m.to_string()],
        _ => vec!["13".into(), "12".into()],
    };
    let versioned =
        |base: &str| -> Vec<String> { majors.iter().map(|m| format!("{base}.so.{m}")).collect() };
    vec![
        ("libcuda", vec!["libcuda.so.1".into()], cuda),
        ("libcudart", versioned("libcudart"), cuda),
        ("libcublas", versioned("libcublas"), cuda),
        ("libcublasLt", versioned("libcublasLt"), cuda),
        ("libcurand", vec!["libcurand.so.10".into()], cuda),
        // Informational until a feature uses NCCL (tensor parallelism).
        // Only --tp on GPUs needs it; a `nccl` build links it, so it is loaded before main.
        (
            "libnccl",
            vec!["libnccl.so.2".into()],
            cfg!(feature = "nccl"),
        ),
    ]
}

fn probe_libraries(cuda_build: Option<&str>) -> Vec<LibraryInfo> {
    library_specs(cuda_build)
        .into_iter()
        .map(|(name, sonames, needed)| probe_library(name, sonames, needed))
        .collect()
}

fn probe_library(name: &str, sonames: Vec<String>, needed: bool) -> LibraryInfo {
    let mut errors = vec![];
    for soname in &sonames {
        // SAFETY: loading runs the library's initialisers; NVIDIA's libraries only set up their
        // own state there (the CUDA build has them loaded already, so this only takes a
        // reference). The handle is dropped (dlclose) at the end of this scope.
        match unsafe { libloading::Library::new(soname) } {
            Ok(lib) => {
                let (version, path) = library_version(name, &lib);
                return LibraryInfo {
                    name: name.into(),
                    sonames,
                    needed,
                    version,
                    path,
                    error: None,
                };
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    LibraryInfo {
        name: name.into(),
        sonames,
        needed,
        version: None,
        path: None,
        error: Some(errors.join("; ")),
    }
}

type IntOut = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The version through the library's own API, and the file the symbol lives in.
fn library_version(name: &str, lib: &libloading::Library) -> (Option<String>, Option<String>) {
    // SAFETY (all calls below): each symbol is looked up by its documented C name and called
    // with its documented signature; the out-pointers point at live locals.
    unsafe {
        match name {
            "libcublas" => {
                type Prop = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
                let Ok(f) = lib.get::<Prop>(b"cublasGetProperty\0") else {
                    return (None, None);
                };
                // libraryPropertyType: MAJOR_VERSION 0, MINOR_VERSION 1, PATCH_LEVEL 2.
                let mut v = [0 as c_int; 3];
                let ok = (0..3).all(|i| f(i as c_int, &mut v[i]) == 0);
                let version = ok.then(|| format!("{}.{}.{}", v[0], v[1], v[2]));
                (version, symbol_path(*f as *const c_void))
            }
            "libcublasLt" => {
                type Ver = unsafe extern "C" fn() -> usize;
                let Ok(f) = lib.get::<Ver>(b"cublasLtGetVersion\0") else {
                    return (None, None);
                };
                let v = f();
                // CUBLAS_VERSION = major * 10000 + minor * 100 + patch (cublas_api.h).
                let version = format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
                (Some(version), symbol_path(*f as *const c_void))
            }
            _ => {
                let (symbol, decode): (&[u8], fn(i32) -> String) = match name {
                    "libcuda" => (b"cuDriverGetVersion\0", |v| version_5(&v.to_string())),
                    "libcudart" => (b"cudaRuntimeGetVersion\0", |v| version_5(&v.to_string())),
                    // CURAND_VERSION = major * 1000 + minor * 100 + patch (curand.h).
                    "libcurand" => (b"curandGetVersion\0", |v| {
                        format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
                    }),
                    "libnccl" => (b"ncclGetVersion\0", nccl_version),
                    _ => return (None, None),
                };
                let Ok(f) = lib.get::<IntOut>(symbol) else {
                    return (None, None);
                };
                let mut v: c_int = 0;
                let version = (f(&mut v) == 0).then(|| decode(v));
                (version, symbol_path(*f as *const c_void))
            }
        }
    }
}

/// NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9, major * 1000 + minor * 100
/// + patch before.
pub fn nccl_version(code: i32) -> String {
    let (major, minor, patch) = if code >= 20900 {
        (code / 10000, (code % 10000) / 100, code % 100)
    } else {
        (code / 1000, (code % 1000) / 100, code % 100)
    };
    format!("{major}.{minor}.{patch}")
}

fn nccl_info(version: &str) -> NcclInfo {
    NcclInfo {
        version: version.to_string(),
        bf16_and_avg: version_at_least(version, (2, 10)),
    }
}

/// "12.4" or "2.28.9" >= (major, minor).
pub fn version_at_least(version: &str, min: (u32, u32)) -> bool {
    let mut p = version.split('.').map(|s| s.parse::<u32>().unwrap_or(0));
    let v = (p.next().unwrap_or(0), p.next().unwrap_or(0));
    v >= min
}

/// The file holding `addr` (dladdr), resolved to its real path.
fn symbol_path(addr: *const c_void) -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as a number and fills `info`; a zero return means
    // nothing was filled, and we do not read it then.
    let info = unsafe {
        if libc::dladdr(addr, info.as_mut_ptr()) == 0 {
            return None;
        }
        info.assume_init()
    };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader, alive while the
    // library is loaded (it is: we hold a handle).
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some(
        std::fs::canonicalize(&name)
            .map(|p| p.display().to_string())
            .unwrap_or(name),
    )
}

// ---------------------------------------------------------------------------------------------
// Diagnosis

/// Known problems in a report, each with a fix. Pure: testable with made-up reports.
pub fn diagnose(r: &EnvReport) -> Vec<Problem> {
    let cuda = r.build_features.iter().any(|f| f == "cuda");
    let mut out = vec![];
    let mut push = |severity, what: String, fix: String| {
        out.push(Problem {
            severity,
            what,
            fix,
        })
    };

    if let Some(e) = &r.nvml_error {
        let what = format!("no NVIDIA driver / GPU found (NVML: {e})");
        if cuda {
            push(
                Severity::Error,
                what,
                "install the NVIDIA driver; in a container, start it with the GPUs visible (docker --gpus all, NVIDIA container toolkit)".into(),
            );
        } else {
            push(
                Severity::Note,
                what,
                "CPU-only: fine for this build (it has no `cuda` feature)".into(),
            );
        }
    } else if r.gpus.is_empty() {
        push(
            if cuda {
                Severity::Error
            } else {
                Severity::Note
            },
            "the NVIDIA driver is loaded but reports no GPU".into(),
            "check CUDA_VISIBLE_DEVICES, the container's --gpus, and `dmesg` for Xid errors".into(),
        );
    }

    if let (Some(build), Some(drv)) = (&r.cuda_build_version, &r.cuda_driver_version) {
        if let Some(b) = major_minor(build) {
            if !version_at_least(drv, b) {
                push(
                    Severity::Error,
                    format!(
                        "the driver {} supports CUDA up to {drv}, this binary was built for CUDA {build}",
                        r.driver_version.as_deref().unwrap_or("?")
                    ),
                    format!(
                        "upgrade the NVIDIA driver to one supporting CUDA {build}{}, or rebuild with a CUDA {drv} toolkit (CUDARC_CUDA_VERSION={}{:02}0)",
                        min_driver(b).map(|d| format!(" (>= {d})")).unwrap_or_default(),
                        drv.split('.').next().unwrap_or("12"),
                        drv.split('.').nth(1).and_then(|m| m.parse::<u32>().ok()).unwrap_or(0)
                    ),
                );
            }
        }
    }

    for l in &r.libraries {
        if !l.found() {
            if !l.needed {
                continue;
            }
            let fix = if l.name == "libcuda" {
                "libcuda.so.1 comes with the NVIDIA driver: install the driver, or in a container mount it (NVIDIA container toolkit)".to_string()
            } else {
                format!(
                    "set LD_LIBRARY_PATH to the directory holding {} (e.g. /usr/local/cuda/lib64, or a pip wheel's nvidia/cu{}/lib)",
                    l.sonames.join(" or "),
                    r.cuda_build_version
                        .as_deref()
                        .and_then(|v| v.split('.').next())
                        .unwrap_or("13")
                )
            };
            push(
                Severity::Error,
                format!("{} not found ({})", l.name, l.sonames.join(", ")),
                fix,
            );
        } else if l.name == "libcudart" || l.name == "libcublas" {
            // A runtime newer than the driver fails with "driver version is insufficient".
            if let (Some(v), Some(drv)) = (&l.version, &r.cuda_driver_version) {
                if l.name == "libcudart"
                    && major_minor(v).is_some_and(|m| !version_at_least(drv, m))
                {
                    push(
                        if l.needed { Severity::Error } else { Severity::Warning },
                        format!(
                            "{} {v} (from {}) is newer than the driver's CUDA {drv}",
                            l.name,
                            l.path.as_deref().unwrap_or("?")
                        ),
                        format!("upgrade the driver, or put a CUDA {drv} runtime first on LD_LIBRARY_PATH"),
                    );
                }
            }
        }
    }

    if let Some(n) = &r.nccl {
        if !n.bf16_and_avg {
            push(
                Severity::Warning,
                format!("NCCL {} has no bf16 reductions and no ncclAvg (needs >= 2.10)", n.version),
                "put a newer libnccl.so.2 first on LD_LIBRARY_PATH (e.g. pip nvidia-nccl-cu13: its nvidia/nccl/lib)".into(),
            );
        }
    }

    let mut seen = std::collections::BTreeSet::new();
    for p in &r.p2p {
        let pair = (p.from.min(p.to), p.from.max(p.to));
        if p.read != "ok" && seen.insert(pair) {
            push(
                Severity::Warning,
                format!("no peer access GPU {} -> GPU {} ({})", p.from, p.to, p.read),
                "tensor parallelism across these GPUs goes through host memory: expect slow TP (check `nvidia-smi topo -m`, IOMMU/ACS settings)".into(),
            );
        }
    }

    for g in &r.gpus {
        if g.mig_enabled == Some(true) {
            push(
                Severity::Warning,
                format!("GPU {} ({}) is in MIG mode", g.index, g.name),
                "a MIG slice has a fraction of the SMs and memory: results are not comparable with a whole GPU".into(),
            );
        }
    }
    out
}

fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut p = v.split('.');
    Some((
        p.next()?.parse().ok()?,
        p.next().unwrap_or("0").parse().ok()?,
    ))
}

/// Minimum Linux driver of a CUDA toolkit release (CUDA release notes, "CUDA Toolkit and
/// Corresponding Driver Versions"). Minor-version compatibility does not help here: candle
/// ships PTX, and the driver must JIT PTX of the toolkit's ISA version.
fn min_driver(cuda: (u32, u32)) -> Option<&'static str> {
    Some(match cuda {
        (13, _) => "580.65.06",
        (12, 0) => "525.60.13",
        (12, 1) => "530.30.02",
        (12, 2) => "535.54.03",
        (12, 3) => "545.23.06",
        (12, 4) => "550.54.14",
        (12, 5) => "555.42.02",
        (12, 6) => "560.28.03",
        (12, 8) => "570.26",
        (12, 9) => "575.51.03",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: usize, uuid: &str) -> GpuInfo {
        GpuInfo {
            index,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: Some(uuid.into()),
            ..Default::default()
        }
    }

    fn lib(name: &str, needed: bool, version: Option<&str>) -> LibraryInfo {
        LibraryInfo {
            name: name.into(),
            sonames: vec![format!("{name}.so.13")],
            needed,
            version: version.map(Into::into),
            path: version.map(|_| format!("/usr/lib/{name}.so.13")),
            error: None,
        }
    }

    fn gpu_report() -> EnvReport {
        EnvReport {
            build_features: vec!["cuda".into()],
            cuda_build_version: Some("13.0".into()),
            driver_version: Some("580.159.04".into()),
            cuda_driver_version: Some("13.0".into()),
            gpus: vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")],
            libraries: vec![
                lib("libcuda", true, Some("13.0")),
                lib("libcudart", true, Some("13.0")),
                lib("libcublas", true, Some("13.1.0")),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_healthy_gpu_host_has_no_problems() {
        assert_eq!(diagnose(&gpu_report()), vec![]);
    }

    #[test]
    fn driver_older_than_the_build_is_an_error_with_the_driver_to_get() {
        let mut r = gpu_report();
        r.cuda_driver_version = Some("12.4".into());
        r.libraries.retain(|l| l.name != "libcudart");
        let p = diagnose(&r);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].severity, Severity::Error);
        assert!(p[0].what.contains("up to 12.4") && p[0].what.contains("CUDA 13.0"));
        assert!(
            p[0].fix.contains("580.65.06") && p[0].fix.contains("CUDARC_CUDA_VERSION=12040"),
            "{}",
            p[0].fix
        );
    }

    #[test]
    fn missing_library_says_which_variable_to_set() {
        let mut r = gpu_report();
        r.libraries.push(lib("libcublasLt", true, None));
        r.libraries.push(lib("libnccl", false, None));
        let p = diagnose(&r);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].severity, Severity::Error);
        assert!(p[0].what.contains("libcublasLt not found"));
        assert!(p[0].fix.contains("LD_LIBRARY_PATH") && p[0].fix.contains("cu13"));
    }

    #[test]
    fn runtime_newer_than_driver_is_flagged() {
        let mut r = gpu_report();
        r.libraries[1].version = Some("13.1".into());
        let p = diagnose(&r);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].what.contains("newer than the driver's CUDA 13.0"));
    }

    #[test]
    fn no_p2p_warns_once_per_pair_and_old_nccl_warns() {
        let mut r = gpu_report();
        for (from, to) in [(0, 1), (1, 0)] {
            r.p2p.push(P2pLink {
                from,
                to,
                read: "not_supported".into(),
                write: "not_supported".into(),
                nvlink: "not_supported".into(),
            });
        }
        r.nccl = Some(nccl_info("2.8.4"));
        let p = diagnose(&r);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().all(|p| p.severity == Severity::Warning));
        assert!(p.iter().any(|p| p.fix.contains("slow TP")));
        assert!(p.iter().any(|p| p.what.contains("NCCL 2.8.4")));
        assert!(!r.has_errors());
    }

    #[test]
    fn no_driver_is_a_note_on_cpu_builds_and_an_error_on_cuda_builds() {
        let mut r = EnvReport {
            nvml_error: Some("libnvidia-ml.so.1 not loadable".into()),
            ..Default::default()
        };
        let p = diagnose(&r);
        assert_eq!(p[0].severity, Severity::Note);
        assert!(p[0].what.contains("no NVIDIA driver / GPU found"));
        r.build_features = vec!["cuda".into()];
        assert_eq!(diagnose(&r)[0].severity, Severity::Error);
    }

    #[test]
    fn version_codes() {
        assert_eq!(nccl_version(22809), "2.28.9");
        assert_eq!(nccl_version(2804), "2.8.4");
        assert_eq!(version_5("12040"), "12.4");
        assert!(nccl_info("2.10.3").bf16_and_avg && !nccl_info("2.9.9").bf16_and_avg);
        assert!(version_at_least("13.0", (12, 4)) && !version_at_least("12.2", (12, 4)));
    }

    #[test]
    fn cuda_ordinals_map_to_nvml_indices() {
        let gpus = [gpu(0, "GPU-aaaa"), gpu(1, "GPU-bbbb"), gpu(2, "GPU-cccc")];
        assert_eq!(nvml_index(1, None, None, &gpus), Some(1));
        assert_eq!(nvml_index(0, None, Some("2,0"), &gpus), Some(2));
        assert_eq!(nvml_index(1, None, Some("GPU-cc,GPU-bb"), &gpus), Some(1));
        assert_eq!(nvml_index(0, Some("GPU-bbbb"), Some("2"), &gpus), Some(1));
        assert_eq!(nvml_index(3, None, Some("0,1"), &gpus), None);
    }

    #[test]
    fn schema_1_headers_still_read() {
        let old = r#"{"hostname":"vm","os":"linux x86_64","cpu":"Xeon","n_cpus":16,"gpus":[{"index":0,"name":"NVIDIA H100 80GB HBM3","memory_bytes":85017493504,"compute_capability":"9.0"}],"driver_version":"580.159.04","cuda_driver_version":"13.0","cuda_build_version":"13.0"}"#;
        let r: EnvReport = serde_json::from_str(old).unwrap();
        assert_eq!(r.gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert!(r.libraries.is_empty() && r.problems.is_empty());
    }
}
