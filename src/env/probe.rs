//! What the host has, read from `/proc`, `/etc/os-release` and the build: OS, CPU, RAM, build
//! features; and every CUDA library the binary uses, loaded by soname as the dynamic loader
//! would, with its version through the library's own API and the file it came from (dladdr).
//! Also the version codes of CUDA and NCCL, decoded.

use super::report::{LibraryInfo, NcclInfo};
use std::ffi::{c_int, c_void, CStr};

// ---------------------------------------------------------------------------------------------
// Host

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

pub(super) fn cuda_build_version() -> Option<String> {
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

pub(super) fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

pub(super) fn os_name() -> String {
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

pub(super) fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

pub(super) fn mem_total_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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

pub(super) fn probe_libraries(cuda_build: Option<&str>) -> Vec<LibraryInfo> {
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

// ---------------------------------------------------------------------------------------------
// Version codes

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

pub(super) fn nccl_info(version: &str) -> NcclInfo {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes() {
        assert_eq!(nccl_version(22809), "2.28.9");
        assert_eq!(nccl_version(2804), "2.8.4");
        assert_eq!(version_5("12040"), "12.4");
        assert!(nccl_info("2.10.3").bf16_and_avg && !nccl_info("2.9.9").bf16_and_avg);
        assert!(version_at_least("13.0", (12, 4)) && !version_at_least("12.2", (12, 4)));
    }
}
