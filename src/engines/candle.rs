//! The candle engine: this crate's models, in process.

use super::{BatchOutput, Engine};
use crate::error::Result;
use crate::models::CausalLm;
use crate::suites::lambada::{target_scores, Request};
use crate::trackers::{LatencyTracker, MemoryReading, MemoryTracker};
use candle_core::Device;
use std::collections::BTreeMap;

pub struct CandleEngine {
    pub model: Box<dyn CausalLm>,
    pub device: Device,
    pub memory: Option<MemoryTracker>,
    pub load_seconds: f64,
}

impl Engine for CandleEngine {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn info(&self) -> BTreeMap<String, String> {
        let mut info = BTreeMap::from([("candle".into(), "0.11.1".into())]);
        if self.device.is_cuda() {
            info.insert("fused".into(), crate::kernels::describe());
        }
        info
    }

    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    fn score(&mut self, batch: &[Request]) -> Result<BatchOutput> {
        let _profiled = crate::profile::window(&self.device);
        let mut timer = LatencyTracker::new(&self.device);
        timer.start()?;
        let scores = target_scores(self.model.as_ref(), batch, &self.device)?;
        Ok(BatchOutput {
            scores,
            latency_ms: timer.stop_ms()?,
        })
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        match &self.memory {
            Some(m) => m.read(),
            None => Ok(MemoryReading::default()),
        }
    }
}
