//! The checks behind `bench env`'s exit code: [`diagnose`] turns a report's facts into
//! [`Problem`]s, each with a fix line. Pure (a report in, problems out), so every check is
//! tested with made-up reports. An [`Severity::Error`] means something the built features need
//! is missing.

use super::probe::version_at_least;
use super::report::{EnvReport, LibraryInfo, Problem, Severity};

/// Known problems in a report, each with a fix. Pure: testable with made-up reports.
///
/// Order: driver / GPUs, driver against the build's CUDA, libraries, NCCL, peer access, MIG.
pub fn diagnose(r: &EnvReport) -> Vec<Problem> {
    let mut out: Vec<Problem> = vec![];
    out.extend(no_driver_or_gpu(r));
    out.extend(driver_older_than_build(r));
    out.extend(r.libraries.iter().filter_map(|l| library_problem(r, l)));
    out.extend(old_nccl(r));
    out.extend(no_peer_access(r));
    out.extend(mig_gpus(r));
    out
}

fn problem(severity: Severity, what: String, fix: String) -> Problem {
    Problem {
        severity,
        what,
        fix,
    }
}

/// An error on a `cuda` build, a note on a CPU build.
fn for_build(r: &EnvReport) -> Severity {
    if r.build_features.iter().any(|f| f == "cuda") {
        Severity::Error
    } else {
        Severity::Note
    }
}

/// NVML did not start, or sees no GPU.
fn no_driver_or_gpu(r: &EnvReport) -> Option<Problem> {
    let severity = for_build(r);
    if let Some(e) = &r.nvml_error {
        let what = format!("no NVIDIA driver / GPU found (NVML: {e})");
        let fix = if severity == Severity::Error {
            "install the NVIDIA driver; in a container, start it with the GPUs visible (docker --gpus all, NVIDIA container toolkit)"
        } else {
            "CPU-only: fine for this build (it has no `cuda` feature)"
        };
        Some(problem(severity, what, fix.into()))
    } else if r.gpus.is_empty() {
        Some(problem(
            severity,
            "the NVIDIA driver is loaded but reports no GPU".into(),
            "check CUDA_VISIBLE_DEVICES, the container's --gpus, and `dmesg` for Xid errors".into(),
        ))
    } else {
        None
    }
}

/// The driver supports an older CUDA than the binary was built for.
fn driver_older_than_build(r: &EnvReport) -> Option<Problem> {
    let (build, drv) = (
        r.cuda_build_version.as_ref()?,
        r.cuda_driver_version.as_ref()?,
    );
    let b = major_minor(build)?;
    if version_at_least(drv, b) {
        return None;
    }
    Some(problem(
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
    ))
}

/// A needed library that is missing, or a CUDA runtime newer than the driver.
fn library_problem(r: &EnvReport, l: &LibraryInfo) -> Option<Problem> {
    if !l.found() {
        return l.needed.then(|| missing_library(r, l));
    }
    runtime_newer_than_driver(r, l)
}

fn missing_library(r: &EnvReport, l: &LibraryInfo) -> Problem {
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
    problem(
        Severity::Error,
        format!("{} not found ({})", l.name, l.sonames.join(", ")),
        fix,
    )
}

/// A runtime newer than the driver fails with "driver version is insufficient".
fn runtime_newer_than_driver(r: &EnvReport, l: &LibraryInfo) -> Option<Problem> {
    if l.name != "libcudart" {
        return None;
    }
    let (v, drv) = (l.version.as_ref()?, r.cuda_driver_version.as_ref()?);
    if version_at_least(drv, major_minor(v)?) {
        return None;
    }
    Some(problem(
        if l.needed {
            Severity::Error
        } else {
            Severity::Warning
        },
        format!(
            "{} {v} (from {}) is newer than the driver's CUDA {drv}",
            l.name,
            l.path.as_deref().unwrap_or("?")
        ),
        format!("upgrade the driver, or put a CUDA {drv} runtime first on LD_LIBRARY_PATH"),
    ))
}

fn old_nccl(r: &EnvReport) -> Option<Problem> {
    let n = r.nccl.as_ref().filter(|n| !n.bf16_and_avg)?;
    Some(problem(
        Severity::Warning,
        format!("NCCL {} has no bf16 reductions and no ncclAvg (needs >= 2.10)", n.version),
        "put a newer libnccl.so.2 first on LD_LIBRARY_PATH (e.g. pip nvidia-nccl-cu13: its nvidia/nccl/lib)".into(),
    ))
}

/// One warning per unordered GPU pair without peer reads.
fn no_peer_access(r: &EnvReport) -> Vec<Problem> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = vec![];
    for p in &r.p2p {
        let pair = (p.from.min(p.to), p.from.max(p.to));
        if p.read != "ok" && seen.insert(pair) {
            out.push(problem(
                Severity::Warning,
                format!("no peer access GPU {} -> GPU {} ({})", p.from, p.to, p.read),
                "tensor parallelism across these GPUs goes through host memory: expect slow TP (check `nvidia-smi topo -m`, IOMMU/ACS settings)".into(),
            ));
        }
    }
    out
}

fn mig_gpus(r: &EnvReport) -> Vec<Problem> {
    let mig = r.gpus.iter().filter(|g| g.mig_enabled == Some(true));
    mig.map(|g| {
        problem(
            Severity::Warning,
            format!("GPU {} ({}) is in MIG mode", g.index, g.name),
            "a MIG slice has a fraction of the SMs and memory: results are not comparable with a whole GPU".into(),
        )
    })
    .collect()
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
    use crate::env::fixtures::{gpu_report, lib};
    use crate::env::probe::nccl_info;
    use crate::env::P2pLink;

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
}
