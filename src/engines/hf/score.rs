//! The HF engine's LAMBADA scoring: the worker's `score` op.

use super::HfEngine;
use crate::engines::{BatchOutput, Request, Score, TargetScores};
use crate::error::{Error, Result};
use serde_json::{json, Value};

/// The worker's `score` request for `batch`, right-padded to `padded_len`.
pub(crate) fn score_request(batch: &[Request], padded_len: usize) -> Value {
    let inputs: Vec<&[u32]> = batch.iter().map(|r| r.input.as_slice()).collect();
    let targets: Vec<&[u32]> = batch.iter().map(|r| r.target_tokens.as_slice()).collect();
    json!({ "op": "score", "inputs": inputs, "targets": targets, "padded_len": padded_len })
}

impl Score for HfEngine {
    fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn score(&mut self, batch: &[Request], padded_len: usize) -> Result<BatchOutput> {
        let v = self.request(&score_request(batch, padded_len))?;
        self.count_compiles(&v);
        let field = |k: &str| -> Result<Vec<Value>> {
            v[k].as_array()
                .cloned()
                .ok_or_else(|| Error::Engine(format!("HF worker reply has no '{k}' list")))
        };
        let token_ll = field("token_ll")?
            .iter()
            .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
            .collect();
        let argmax = field("argmax")?
            .iter()
            .map(|x| x.as_u64().unwrap_or(u64::MAX) as u32)
            .collect();
        let latency_ms = v["latency_ms"]
            .as_f64()
            .ok_or_else(|| Error::Engine("HF worker reply has no latency_ms".into()))?;
        Ok(BatchOutput {
            scores: TargetScores { token_ll, argmax },
            latency_ms,
        })
    }

    fn choose_config(&mut self, probe: &[(&[Request], usize)], cold_share: f64) -> Result<()> {
        let requests = probe.iter().map(|(b, t)| score_request(b, *t)).collect();
        self.choose(requests, cold_share).map(|_| ())
    }
}
