//! Made-up reports for the tests of every file of `env`.

use super::report::{EnvReport, GpuInfo, LibraryInfo};

pub fn gpu(index: usize, uuid: &str) -> GpuInfo {
    GpuInfo {
        index,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: Some(uuid.into()),
        ..Default::default()
    }
}

pub fn lib(name: &str, needed: bool, version: Option<&str>) -> LibraryInfo {
    LibraryInfo {
        name: name.into(),
        sonames: vec![format!("{name}.so.13")],
        needed,
        version: version.map(Into::into),
        path: version.map(|_| format!("/usr/lib/{name}.so.13")),
        error: None,
    }
}

/// Two H100s on a healthy CUDA 13 host.
pub fn gpu_report() -> EnvReport {
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
