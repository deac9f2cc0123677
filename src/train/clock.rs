//! A step's clocks. [`PhaseClock`] (`--phase-times`) adds device-synchronized wall time to
//! the phase a step is in (forward, backward, update). [`CommClock`] times the collectives of
//! a data-parallel step without stalling the host: CUDA events on candle's stream around the
//! all-reduce (read after the step's one sync), the wall clock on the CPU (where the TCP
//! all-reduce is synchronous anyway). The sync-based clock this replaces stopped the host twice
//! a step, and the copies queued after each stop ran at the host's launch rate, not the GPU's.

use crate::record::PhaseMs;
use candle_core::{Device, Result};

/// Accumulates device-synchronized wall time into the phases of a step; does nothing (no
/// synchronize) without a device.
pub struct PhaseClock<'a> {
    device: Option<&'a Device>,
    last: std::time::Instant,
    phases: PhaseMs,
}

impl<'a> PhaseClock<'a> {
    pub fn new(device: Option<&'a Device>) -> Result<Self> {
        if let Some(d) = device {
            d.synchronize()?;
        }
        Ok(Self {
            device,
            last: std::time::Instant::now(),
            phases: PhaseMs {
                forward: 0.,
                backward: 0.,
                update: 0.,
            },
        })
    }

    /// Adds the time since the last lap to the phase `pick` selects.
    pub fn lap(&mut self, pick: impl Fn(&mut PhaseMs) -> &mut f64) -> Result<()> {
        if let Some(d) = self.device {
            d.synchronize()?;
            let now = std::time::Instant::now();
            *pick(&mut self.phases) += (now - self.last).as_secs_f64() * 1e3;
            self.last = now;
        }
        Ok(())
    }

    /// The phases' times; None when the clock has no device (phases not timed).
    pub fn phases(&self) -> Option<PhaseMs> {
        self.device.map(|_| self.phases)
    }
}

/// A collective phase being timed.
pub enum CommClock {
    #[cfg(feature = "cuda")]
    Events(candle_core::cuda::cudarc::driver::CudaEvent),
    Wall(std::time::Instant),
}

/// A timed phase, read once the device has passed its end.
pub enum CommSpan {
    #[cfg(feature = "cuda")]
    Events(
        candle_core::cuda::cudarc::driver::CudaEvent,
        candle_core::cuda::cudarc::driver::CudaEvent,
    ),
    Ms(f64),
}

#[cfg(feature = "cuda")]
fn timed_event(
    d: &candle_core::CudaDevice,
) -> Result<candle_core::cuda::cudarc::driver::CudaEvent> {
    use candle_core::cuda::cudarc::driver::sys::CUevent_flags;
    let stream = d.cuda_stream();
    stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(candle_core::Error::wrap)
}

impl CommClock {
    /// Marks the start: after the work queued so far on `device`.
    pub fn start(device: &Device) -> Result<Self> {
        match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Ok(Self::Events(timed_event(d)?)),
            _ => Ok(Self::Wall(std::time::Instant::now())),
        }
    }

    /// Marks the end: after the work queued since the start (the all-reduce's wait included).
    pub fn stop(self, device: &Device) -> Result<CommSpan> {
        match (self, device) {
            #[cfg(feature = "cuda")]
            (Self::Events(start), Device::Cuda(d)) => Ok(CommSpan::Events(start, timed_event(d)?)),
            (Self::Wall(t), _) => Ok(CommSpan::Ms(t.elapsed().as_secs_f64() * 1e3)),
            #[cfg(feature = "cuda")]
            (Self::Events(_), _) => candle_core::bail!("a CUDA clock stopped on another device"),
        }
    }
}

impl CommSpan {
    /// Milliseconds between the marks (waits for the end mark on CUDA).
    pub fn ms(&self) -> Result<f64> {
        match self {
            #[cfg(feature = "cuda")]
            Self::Events(start, end) => {
                let ms = start.elapsed_ms(end).map_err(candle_core::Error::wrap)?;
                Ok(ms as f64)
            }
            Self::Ms(ms) => Ok(*ms),
        }
    }
}
