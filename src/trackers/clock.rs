//! Laps of one timed call: [`StepClock`], handed by a scenario to an engine, gives the time to
//! each new token of a generate call (the first lap is the time to first token, the
//! differences are inter-token latencies), whichever engine ran it: an engine in this process
//! clocks its device (synchronized before each read), a child engine hands over the laps it
//! took in its own process with the same rule ([`StepClock::record`]).

use crate::device::synchronize;
use crate::error::Result;
use candle_core::Device;
use std::time::Instant;

/// Device-synchronized laps from one start, and the call's total.
#[derive(Debug, Default)]
pub struct StepClock {
    /// Laps are taken (a synchronize each); off, only the total.
    timed_laps: bool,
    start: Option<Instant>,
    laps_ms: Vec<f64>,
    total_ms: Option<f64>,
}

impl StepClock {
    /// A clock for one call; `timed_laps` asks for a synchronized lap at each step.
    pub fn new(timed_laps: bool) -> Self {
        Self {
            timed_laps,
            ..Self::default()
        }
    }

    /// Whether the caller wants laps (a child engine passes this on).
    pub fn timed_laps(&self) -> bool {
        self.timed_laps
    }

    /// Starts the clock once `device` has finished its earlier work.
    pub fn start(&mut self, device: &Device) -> Result<()> {
        synchronize(device)?;
        self.laps_ms.clear();
        self.total_ms = None;
        self.start = Some(Instant::now());
        Ok(())
    }

    /// A lap once `device` has finished the step's work (nothing when laps are off).
    pub fn lap(&mut self, device: &Device) -> Result<()> {
        if self.timed_laps {
            synchronize(device)?;
            let ms = self.elapsed_ms();
            self.laps_ms.push(ms);
        }
        Ok(())
    }

    /// Stops the clock: the call's total. The caller has synchronized (e.g. read the results
    /// back to the host).
    pub fn stop(&mut self) {
        self.total_ms = Some(self.elapsed_ms());
    }

    /// A child engine's laps and total, taken in its process with the same rule.
    pub fn record(&mut self, total_ms: f64, laps_ms: Vec<f64>) {
        self.total_ms = Some(total_ms);
        self.laps_ms = laps_ms;
    }

    /// The call's total (0 before [`StepClock::stop`] or [`StepClock::record`]).
    pub fn total_ms(&self) -> f64 {
        self.total_ms.unwrap_or(0.)
    }

    /// Every lap, ms from the start (the serving suite places a batch's tokens with them).
    pub fn laps_ms(&self) -> &[f64] {
        &self.laps_ms
    }

    /// Time to the first lap (the first token).
    pub fn first_ms(&self) -> Option<f64> {
        self.laps_ms.first().copied()
    }

    /// Time between consecutive laps (inter-token latencies).
    pub fn between_ms(&self) -> Vec<f64> {
        self.laps_ms.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn elapsed_ms(&self) -> f64 {
        let start = self.start.expect("StepClock::start before its laps");
        start.elapsed().as_secs_f64() * 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Laps are kept only when asked for; the first lap and the gaps are what the log's time to
    /// first token and inter-token latencies are made of; a child's laps read the same.
    #[test]
    fn laps_give_the_first_token_and_the_gaps() {
        let dev = Device::Cpu;
        let mut off = StepClock::new(false);
        off.start(&dev).unwrap();
        off.lap(&dev).unwrap();
        off.stop();
        assert_eq!((off.first_ms(), off.between_ms().len()), (None, 0));
        assert!(off.total_ms() >= 0.);
        let mut on = StepClock::new(true);
        on.start(&dev).unwrap();
        for _ in 0..3 {
            on.lap(&dev).unwrap();
        }
        on.stop();
        assert_eq!(on.between_ms().len(), 2);
        assert!(on.between_ms().iter().all(|&d| d >= 0.));
        assert!(on.total_ms() >= on.first_ms().unwrap());
        let mut child = StepClock::new(true);
        child.record(10., vec![4., 6., 9.]);
        assert_eq!(
            (child.first_ms(), child.between_ms()),
            (Some(4.), vec![2., 3.])
        );
        assert_eq!(child.total_ms(), 10.);
    }
}
