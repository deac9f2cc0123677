//! What the driver says, through NVML (`libnvidia-ml.so.1`, loaded at run time): the driver
//! and its highest CUDA, every GPU's facts, the peer-access matrix; NVML's errors worded for a
//! user; and the mapping from a CUDA ordinal to an NVML index.

use super::probe::version_5;
use super::report::{GpuInfo, P2pLink};
use nvml_wrapper::enum_wrappers::device::{Clock, P2pCapabilitiesIndex as P2p, P2pStatus};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

/// What [`nvml_facts`] read.
pub(super) struct NvmlFacts {
    pub(super) driver_version: String,
    pub(super) cuda_driver_version: Option<String>,
    pub(super) gpus: Vec<GpuInfo>,
    pub(super) p2p: Vec<P2pLink>,
}

/// NVML's error, worded for a user.
pub fn nvml_error(e: NvmlError) -> String {
    use NvmlError as E;
    match e {
        E::LibloadingError(e) => e.to_string(),
        E::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".into(),
        E::NoPermission => "no permission to talk to the driver".into(),
        e => e.to_string(),
    }
}

/// The driver, every GPU and every ordered GPU pair; the error (worded) when NVML cannot start.
pub(super) fn nvml_facts() -> std::result::Result<NvmlFacts, String> {
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
        match nvml.device_by_index(i) {
            Ok(d) => {
                gpus.push(gpu_info(i as usize, &d));
                devices.push((i as usize, d));
            }
            Err(e) => gpus.push(GpuInfo {
                index: i as usize,
                name: format!("unreadable ({})", nvml_error(e)),
                ..Default::default()
            }),
        }
    }
    Ok(NvmlFacts {
        driver_version,
        cuda_driver_version,
        gpus,
        p2p: p2p_links(&devices),
    })
}

/// One GPU's facts; a field NVML refuses is None (or "unknown (…)" for the name).
fn gpu_info(index: usize, d: &Device<'_>) -> GpuInfo {
    // NVML_NVLINK_MAX_LINKS is 18; links past the GPU's count answer an error.
    let nvlinks = (0..18)
        .map(|l| d.link_wrapper_for(l).is_active())
        .take_while(|r| r.is_ok())
        .filter(|r| matches!(r, Ok(true)))
        .count() as u32;
    GpuInfo {
        index,
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
    }
}

/// Peer access for every ordered pair of readable GPUs (NVML index, device).
fn p2p_links(devices: &[(usize, Device<'_>)]) -> Vec<P2pLink> {
    let word = |r: std::result::Result<P2pStatus, NvmlError>| match r {
        Ok(s) => p2p_word(s).to_string(),
        Err(e) => format!("error: {}", nvml_error(e)),
    };
    let mut p2p = vec![];
    for (i, a) in devices {
        for (j, b) in devices {
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
    p2p
}

fn p2p_word(s: P2pStatus) -> &'static str {
    use P2pStatus as S;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::fixtures::gpu;

    #[test]
    fn cuda_ordinals_map_to_nvml_indices() {
        let gpus = [gpu(0, "GPU-aaaa"), gpu(1, "GPU-bbbb"), gpu(2, "GPU-cccc")];
        assert_eq!(nvml_index(1, None, None, &gpus), Some(1));
        assert_eq!(nvml_index(0, None, Some("2,0"), &gpus), Some(2));
        assert_eq!(nvml_index(1, None, Some("GPU-cc,GPU-bb"), &gpus), Some(1));
        assert_eq!(nvml_index(0, Some("GPU-bbbb"), Some("2"), &gpus), Some(1));
        assert_eq!(nvml_index(3, None, Some("0,1"), &gpus), None);
    }
}
