//! Latency of a region of device work: [`LatencyTracker`] synchronizes the device before each
//! clock read.

use crate::device::synchronize;
use crate::error::Result;
use candle_core::Device;
use std::time::Instant;

/// Times regions of device work: synchronizes before each clock read, because CUDA launches
/// return before the work is done.
pub struct LatencyTracker<'a> {
    device: &'a Device,
    start: Option<Instant>,
}

impl<'a> LatencyTracker<'a> {
    pub fn new(device: &'a Device) -> Self {
        Self {
            device,
            start: None,
        }
    }

    pub fn start(&mut self) -> Result<()> {
        synchronize(self.device)?;
        self.start = Some(Instant::now());
        Ok(())
    }

    /// Milliseconds since `start`, after the device finished the region's work.
    pub fn stop_ms(&mut self) -> Result<f64> {
        synchronize(self.device)?;
        let start = self
            .start
            .take()
            .expect("LatencyTracker::stop_ms without start");
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }
}
