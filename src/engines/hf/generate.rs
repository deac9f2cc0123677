//! The HF engine's generation: the worker's `generate` op (`model.generate`, greedy, exactly
//! N new tokens, the same left-padded batch).

use super::HfEngine;
use crate::engines::{Generate, GenerateRequest};
use crate::error::{Error, Result};
use crate::trackers::StepClock;
use serde_json::{json, Value};

/// The worker's `generate` request; `timed_steps` synchronizes after every token.
fn generate_request(req: &GenerateRequest, timed_steps: bool) -> Value {
    json!({
        "op": "generate",
        "prompts": req.prompts,
        "padded_len": req.padded_len,
        "new_tokens": req.new_tokens,
        "pad_id": req.pad_id,
        "time_steps": timed_steps,
    })
}

impl Generate for HfEngine {
    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn generate(&mut self, req: &GenerateRequest, clock: &mut StepClock) -> Result<Vec<Vec<u32>>> {
        let v = self.request(&generate_request(req, clock.timed_laps()))?;
        self.count_compiles(&v);
        let bad = |k: &str| Error::Engine(format!("HF worker generate reply has no '{k}'"));
        let ids: Vec<Vec<u32>> =
            serde_json::from_value(v["ids"].clone()).map_err(|_| bad("ids"))?;
        // The worker's laps, taken in its process with the same rule (synchronized reads).
        let token_ms: Vec<f64> =
            serde_json::from_value(v["token_ms"].clone()).map_err(|_| bad("token_ms"))?;
        let total = v["latency_ms"].as_f64().ok_or_else(|| bad("latency_ms"))?;
        clock.record(total, token_ms);
        Ok(ids)
    }

    fn choose_config(&mut self, probe: &[GenerateRequest], cold_share: f64) -> Result<()> {
        let requests = probe.iter().map(|r| generate_request(r, false)).collect();
        self.choose(requests, cold_share).map(|_| ())
    }
}
