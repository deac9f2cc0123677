//! The HF engine's training: the worker's `train_step` / `eval` ops (HF Trainer's loop written
//! out in `worker.py`).

use super::HfEngine;
use crate::engines::{train_stepwise, AfterSteps, StepBook, Stepwise, TimedStep, Train, Trained};
use crate::error::{Error, Result};
use crate::train::StepOutcome;
use serde_json::json;
use std::path::Path;

impl Train for HfEngine {
    fn train<'a>(&mut self, book: &mut dyn StepBook<'a>, after: &AfterSteps) -> Result<Trained> {
        train_stepwise(self, book, after)
    }
}

impl Stepwise for HfEngine {
    fn step(&mut self, micro_batches: &[Vec<&[u32]>]) -> Result<TimedStep> {
        let v = self.request(&json!({ "op": "train_step", "micro_batches": micro_batches }))?;
        let num = |k: &str| -> Result<f64> {
            v[k].as_f64()
                .ok_or_else(|| Error::Engine(format!("HF worker train_step reply has no '{k}'")))
        };
        Ok(TimedStep {
            outcome: StepOutcome {
                comm_ms: None,
                host_ms: None,
                loss: num("loss")?,
                // null: a non-finite norm (fp16 overflow) that JSON cannot carry.
                grad_norm: v["grad_norm"].as_f64().unwrap_or(f64::INFINITY),
                lr: num("learning_rate")?,
                skipped: v["skipped"].as_bool().unwrap_or(false),
                loss_scale: v["loss_scale"].as_f64(),
                phases_ms: serde_json::from_value(v["phases_ms"].clone()).ok(),
            },
            latency_ms: num("latency_ms")?,
        })
    }

    fn eval(&mut self, blocks: &[Vec<u32>], batch_size: usize) -> Result<(f64, f64)> {
        let v =
            self.request(&json!({ "op": "eval", "blocks": blocks, "batch_size": batch_size }))?;
        match (v["eval_loss"].as_f64(), v["runtime_ms"].as_f64()) {
            (Some(loss), Some(ms)) => Ok((loss, ms / 1e3)),
            _ => Err(Error::Engine(
                "HF worker eval reply has no eval_loss / runtime_ms".into(),
            )),
        }
    }

    fn save(&self, _dir: &Path) -> Result<()> {
        Err(Error::Unsupported(
            "--save writes the candle engine's weights".into(),
        ))
    }
}
