//! Laps of one timed call: [`StepClock`], handed by a scenario to an engine, gives the time to
//! each new token of a generate call (the first lap is the time to first token, the
//! differences are inter-token latencies), whichever engine ran it: an engine in this process
//! clocks its device, a child engine hands over the laps it took in its own process
//! ([`StepClock::record`]). On the CPU a lap reads the clock when the step is done; on CUDA it
//! records an event on the stream and the events are read at [`StepClock::stop`] (CUDA events,
//! as optimum-benchmark's per-token latency tracker), so that timing a step does not make the
//! host wait for it: the next step is queued while this one runs, as it is without laps.

use crate::device::synchronize;
use crate::error::Result;
use candle_core::Device;
use std::time::Instant;

/// Laps from one start, and the call's total.
#[derive(Debug, Default)]
pub struct StepClock {
    /// Laps are taken; off, only the total.
    timed_laps: bool,
    start: Option<Instant>,
    laps_ms: Vec<f64>,
    total_ms: Option<f64>,
    /// CUDA: the start's event and one a lap, read at stop.
    events: Option<events::Laps>,
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
        self.events = match self.timed_laps {
            true => events::Laps::start(device)?,
            false => None,
        };
        self.start = Some(Instant::now());
        Ok(())
    }

    /// A lap at the end of the step's work so far (nothing when laps are off): on CUDA an
    /// event, on the CPU the clock read after a synchronize.
    pub fn lap(&mut self, device: &Device) -> Result<()> {
        if !self.timed_laps {
            return Ok(());
        }
        match &mut self.events {
            Some(laps) => laps.lap()?,
            None => {
                synchronize(device)?;
                let ms = self.elapsed_ms();
                self.laps_ms.push(ms);
            }
        }
        Ok(())
    }

    /// Stops the clock: the call's total, and the laps' events read. The caller has
    /// synchronized (e.g. read the results back to the host).
    pub fn stop(&mut self) -> Result<()> {
        self.total_ms = Some(self.elapsed_ms());
        if let Some(laps) = self.events.take() {
            self.laps_ms = laps.read_ms()?;
        }
        Ok(())
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

/// CUDA events as laps: recorded on the device's stream, read once the stream is done.
#[cfg(feature = "cuda")]
mod events {
    use crate::error::{Error, Result};
    use candle_core::cuda_backend::cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};
    use candle_core::Device;
    use std::sync::Arc;

    pub struct Laps {
        stream: Arc<CudaStream>,
        start: CudaEvent,
        laps: Vec<CudaEvent>,
    }

    impl std::fmt::Debug for Laps {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Laps({} events)", self.laps.len())
        }
    }

    fn cuda_err(e: impl std::fmt::Debug) -> Error {
        Error::Engine(format!("a CUDA event of the step clock: {e:?}"))
    }

    impl Laps {
        /// Laps of `device`'s stream from now; None off CUDA.
        pub fn start(device: &Device) -> Result<Option<Self>> {
            let Device::Cuda(d) = device else {
                return Ok(None);
            };
            let stream = d.cuda_stream();
            let start = record(&stream)?;
            Ok(Some(Self {
                stream,
                start,
                laps: vec![],
            }))
        }

        pub fn lap(&mut self) -> Result<()> {
            self.laps.push(record(&self.stream)?);
            Ok(())
        }

        /// Each lap's ms after the start (waits for the last event).
        pub fn read_ms(self) -> Result<Vec<f64>> {
            self.laps
                .iter()
                .map(|e| Ok(self.start.elapsed_ms(e).map_err(cuda_err)? as f64))
                .collect()
        }
    }

    /// An event with timing, recorded on `stream`.
    fn record(stream: &Arc<CudaStream>) -> Result<CudaEvent> {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(cuda_err)
    }
}

/// Off CUDA there are no events: laps read the clock.
#[cfg(not(feature = "cuda"))]
mod events {
    use crate::error::Result;
    use candle_core::Device;

    #[derive(Debug)]
    pub enum Laps {}

    impl Laps {
        pub fn start(_: &Device) -> Result<Option<Self>> {
            Ok(None)
        }
        pub fn lap(&mut self) -> Result<()> {
            match *self {}
        }
        pub fn read_ms(self) -> Result<Vec<f64>> {
            match self {}
        }
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
        off.stop().unwrap();
        assert_eq!((off.first_ms(), off.between_ms().len()), (None, 0));
        assert!(off.total_ms() >= 0.);
        let mut on = StepClock::new(true);
        on.start(&dev).unwrap();
        for _ in 0..3 {
            on.lap(&dev).unwrap();
        }
        on.stop().unwrap();
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
