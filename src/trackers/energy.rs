//! Energy of a region: [`EnergyTracker`] reads NVML's total-energy counter at start and stop.

use super::nvml::NvmlGpu;
use crate::error::Result;
use std::time::Instant;

/// Energy of a region from NVML's total-energy counter.
pub struct EnergyTracker {
    gpu: NvmlGpu,
    start_mj: u64,
    start: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EnergyReading {
    pub joules: f64,
    /// Wall time between start and stop.
    pub seconds: f64,
}

impl EnergyTracker {
    pub fn start(gpu: &NvmlGpu) -> Result<Self> {
        Ok(Self {
            start_mj: gpu.energy_mj()?,
            gpu: gpu.clone(),
            start: Instant::now(),
        })
    }

    pub fn stop(self) -> Result<EnergyReading> {
        let end = self.gpu.energy_mj()?;
        Ok(EnergyReading {
            joules: end.saturating_sub(self.start_mj) as f64 / 1e3,
            seconds: self.start.elapsed().as_secs_f64(),
        })
    }
}
