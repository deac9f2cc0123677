//! Opening the HF worker from the registry's arguments ([`crate::engines::registry`]), saying
//! so on the console: importing torch and transformers takes seconds, loading the model (and
//! compiling it) more.

use super::{HfAttn, HfEngine, HfOptions};
use crate::engines::args::{EngineArgs, TrainArgs};
use crate::engines::Engine;
use crate::error::{Error, Result};
use crate::models::WeightSource;
use crate::progress::Status;
use crate::record::describe_hf_config;
use serde_json::{json, Value};
use std::path::Path;

impl HfEngine {
    /// The worker for inference on `a.weights` (an HF checkpoint).
    pub fn open(a: &EngineArgs) -> Result<Self> {
        // An in-process engine's run before this one left its memory in the CUDA pool.
        crate::device::release_pool_memory(a.device)?;
        let dir = checkpoint_dir(a.weights)?;
        let msg = format!(
            "starting the HF worker ({}: importing torch, transformers; loading {})",
            a.hf.python().display(),
            dir.display()
        );
        let status = Status::spinner(a.progress, msg);
        let engine = HfEngine::start(a.hf, dir, a.precision, a.device)?;
        let secs = status.elapsed().as_secs_f64();
        let config = match a.hf.attn {
            HfAttn::Best => "attention timed next".to_string(),
            _ => describe_hf_config(&engine.info()),
        };
        status.done(format!(
            "HF worker: loaded the model in {:.2} s ({secs:.1} s with the imports; {config})",
            engine.load_seconds(),
        ));
        Ok(engine)
    }

    /// The worker for training with the run's hyper-parameters (and, under torchrun, its
    /// DDP / FSDP strategy).
    pub fn open_training(a: &EngineArgs, t: &TrainArgs) -> Result<Self> {
        let mut train = serde_json::to_value(t.hyper).expect("hyper serializes");
        train["dropout"] = Value::Bool(t.dropout);
        train["seed"] = json!(a.seed);
        train["phase_times"] = Value::Bool(t.phase_times);
        // The plan leaves HF out of mlp configurations; this is the engine's own guard.
        if t.recompute == crate::train::Recompute::Mlp {
            return Err(crate::error::Error::Unsupported(
                "HF's gradient checkpointing recomputes whole blocks: --recompute on, not mlp"
                    .into(),
            ));
        }
        train["recompute"] = Value::Bool(t.recompute == crate::train::Recompute::Blocks);
        if let Some((size, strategy)) = t.child_parallel {
            train["parallel"] = json!({ "size": size, "strategy": strategy });
        }
        let dir = checkpoint_dir(a.weights)?;
        HfEngine::start_training(a.hf, dir, a.precision, a.device, train)
    }

    /// Checks that the worker's Python imports torch and transformers, saying so.
    pub fn preflight_saying(opts: &HfOptions, progress: bool) -> Result<()> {
        let msg = format!(
            "checking the HF engine's Python ({}: importing torch, transformers)",
            opts.python().display()
        );
        let status = Status::spinner(progress, msg);
        let versions = HfEngine::preflight(opts)?;
        let version = |k: &str| versions.get(k).map_or("?", String::as_str).to_string();
        let secs = status.elapsed().as_secs_f64();
        status.done(format!(
            "HF engine: torch {}, transformers {} ({secs:.1} s to import)",
            version("torch"),
            version("transformers"),
        ));
        Ok(())
    }
}

/// The checkpoint directory the HF engine reads (it never runs on random weights directly).
pub fn checkpoint_dir(weights: &WeightSource) -> Result<&Path> {
    match weights {
        WeightSource::Dir(dir) => Ok(dir),
        WeightSource::Random { .. } => Err(Error::Config(
            "the HF engine loads a checkpoint: random weights are written first".into(),
        )),
    }
}
