//! Small start/stop trackers that suites use to measure (as optimum-benchmark's trackers); each
//! returns a typed value:
//!
//! - `latency.rs`: [`LatencyTracker`], milliseconds of a region of device work.
//! - `clock.rs`: [`StepClock`], the laps of one call (time to first token, inter-token times),
//!   handed by the scenario to whichever engine runs the call.
//! - `memory.rs`: [`MemoryTracker`], the run's peak memory as the engine counts it
//!   ([`MemoryReading`]).
//! - `nvml.rs`: [`NvmlGpu`] and [`GpuSampler`], what the driver sees: the process's device
//!   memory, clocks, utilisation and power ([`GpuSample`], [`GpuActivity`]).
//! - `energy.rs`: [`EnergyTracker`], joules from NVML's energy counter ([`EnergyReading`]).
//! - `check.rs`: [`check_trackers`], `bench env --check-trackers`.
//!
//! Imports from the crate: device, error, env (NVML's error words, GPU indices), flops.

mod check;
mod clock;
mod energy;
mod latency;
mod memory;
mod nvml;

pub use check::check_trackers;
pub use clock::StepClock;
pub use energy::{EnergyReading, EnergyTracker};
pub use latency::LatencyTracker;
pub use memory::{peak_rss_bytes, MemoryReading, MemoryTracker};
pub use nvml::{GpuActivity, GpuSample, GpuSampler, NvmlGpu};
