//! Which engines there are, what each can run, and how each opens: the one place that names
//! them. Scenarios ask here for an engine by kind and capability ([`open_score`],
//! [`open_generate`], [`open_train`]) and never build one themselves; the plan asks
//! [`supports`] before any run starts. Adding an engine: a folder beside candle/, hf/, llmc/
//! with its capabilities' traits implemented, and one line in [`ENGINES`] plus its arm in each
//! `open_*` it supports.

pub use super::args::{EngineArgs, TrainArgs};
use super::candle::train::TrainSetup;
use super::candle::{CandleEngine, CandleTrainer, LoadFrom};
use super::hf::HfEngine;
use super::llmc::{LlmcEngine, LlmcSetup};
use super::replay::Server;
use super::weight_cache::hf_checkpoint;
use super::{EngineKind, Generate, Score, Train};
use crate::error::{Error, Result};
use crate::models::WeightSource;
use std::path::Path;

/// What a run asks of an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// LAMBADA scoring ([`Score`]).
    Score,
    /// Greedy generation ([`Generate`]).
    Generate,
    /// Training steps ([`Train`]).
    Train,
    /// Requests arriving over time (the serving suite): through [`Generate`] call by call, or
    /// the whole load replayed by the engine ([`super::replay::Replay`]).
    Serve,
}

/// Which weights an engine reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// Random weights from the seed, or a checkpoint directory (candle).
    RandomOrDir,
    /// An HF checkpoint directory: random weights are written to one first (HF).
    HfCheckpoint,
    /// Its own initialisation (llm.c).
    OwnInit,
}

/// One engine's declaration.
pub struct Entry {
    pub kind: EngineKind,
    pub capabilities: &'static [Capability],
    pub weights: Weights,
    /// Runs in this process (its memory is ours to read when it fails); else a child process.
    pub in_process: bool,
    /// Chooses between configurations of its own on probe batches (HF's attention and
    /// torch.compile), which the console announces.
    pub probes: bool,
}

/// Every engine. `both` is not one: it runs candle, then HF ([`runs`]).
pub const ENGINES: [Entry; 3] = [
    Entry {
        kind: EngineKind::Candle,
        capabilities: &[
            Capability::Score,
            Capability::Generate,
            Capability::Train,
            Capability::Serve,
        ],
        weights: Weights::RandomOrDir,
        in_process: true,
        probes: false,
    },
    Entry {
        kind: EngineKind::Hf,
        capabilities: &[
            Capability::Score,
            Capability::Generate,
            Capability::Train,
            Capability::Serve,
        ],
        weights: Weights::HfCheckpoint,
        in_process: false,
        probes: true,
    },
    Entry {
        kind: EngineKind::Llmc,
        capabilities: &[Capability::Train],
        weights: Weights::OwnInit,
        in_process: false,
        probes: false,
    },
];

/// The engines `--engine kind` runs, in order: `both` is candle, then HF.
pub fn runs(kind: EngineKind) -> &'static [EngineKind] {
    match kind {
        EngineKind::Both => &[EngineKind::Candle, EngineKind::Hf],
        EngineKind::Candle => &[EngineKind::Candle],
        EngineKind::Hf => &[EngineKind::Hf],
        EngineKind::Llmc => &[EngineKind::Llmc],
    }
}

/// The declaration of one engine (not `both`).
pub fn entry(kind: EngineKind) -> &'static Entry {
    ENGINES
        .iter()
        .find(|e| e.kind == kind)
        .expect("`both` is not an engine: ask runs() first")
}

/// Whether every engine `--engine kind` runs can do `cap`; a one-line error naming the
/// engines that can where not.
pub fn supports(kind: EngineKind, cap: Capability) -> Result<()> {
    if runs(kind)
        .iter()
        .all(|&k| entry(k).capabilities.contains(&cap))
    {
        return Ok(());
    }
    let able: Vec<&str> = ENGINES
        .iter()
        .filter(|e| e.capabilities.contains(&cap))
        .map(|e| e.kind.as_str())
        .collect();
    Err(Error::Config(format!(
        "--engine {} does not run {} suites: use --engine {}",
        kind.as_str(),
        match cap {
            Capability::Score => "scoring",
            Capability::Generate => "generation",
            Capability::Train => "training",
            Capability::Serve => "serving",
        },
        able.join(" or ")
    )))
}

/// The weights every engine of `--engine kind` reads: where one reads an HF checkpoint, random
/// weights are written to one first (once, with `--save-weights` there) and every engine of
/// the run reads that file.
pub fn run_weights(kind: EngineKind, a: &EngineArgs) -> Result<WeightSource> {
    let kinds = runs(kind);
    if kinds
        .iter()
        .all(|&k| entry(k).weights != Weights::HfCheckpoint)
    {
        return Ok(a.weights.clone());
    }
    HfEngine::preflight_saying(a.hf, a.progress)?;
    let dir = hf_checkpoint(a.model, a.weights, a.save_weights, a.device, a.progress)?;
    Ok(WeightSource::Dir(dir))
}

/// The scoring engine `kind` (not `both`), loaded.
pub fn open_score(kind: EngineKind, a: &EngineArgs) -> Result<Box<dyn Score>> {
    Ok(match kind {
        EngineKind::Candle => Box::new(candle(a, random_weights_to(a))?),
        EngineKind::Hf => Box::new(HfEngine::open(a)?),
        _ => return Err(unsupported(kind, Capability::Score)),
    })
}

/// The generating engine `kind` (not `both`), loaded.
pub fn open_generate(kind: EngineKind, a: &EngineArgs) -> Result<Box<dyn Generate>> {
    Ok(match kind {
        EngineKind::Candle => Box::new(candle(a, None)?),
        EngineKind::Hf => Box::new(HfEngine::open(a)?),
        _ => return Err(unsupported(kind, Capability::Generate)),
    })
}

/// The serving engine `kind` (not `both`), loaded: candle serves call by call from the
/// scenario's queue; the HF worker, in another process, replays the whole load on its clock.
pub fn open_serve(kind: EngineKind, a: &EngineArgs) -> Result<Server> {
    Ok(match kind {
        EngineKind::Candle => Server::Calls(Box::new(candle(a, None)?)),
        EngineKind::Hf => Server::Replays(Box::new(HfEngine::open(a)?)),
        _ => return Err(unsupported(kind, Capability::Serve)),
    })
}

/// The training engine `kind` (not `both`), ready for its first step.
pub fn open_train(kind: EngineKind, a: &EngineArgs, t: TrainArgs) -> Result<Box<dyn Train>> {
    Ok(match kind {
        EngineKind::Candle => {
            crate::kernels::set_enabled(a.fused);
            let setup = TrainSetup {
                model: a.model,
                weights: a.weights,
                precision: a.precision,
                hyper: t.hyper,
                dropout: t.dropout,
                backward: t.backward,
                recompute: t.recompute,
                seed: a.seed,
                dp: t.dp,
            };
            let mut candle = CandleTrainer::start(setup, rank_device(a)?)?;
            candle.trainer.phase_times = t.phase_times;
            Box::new(candle)
        }
        EngineKind::Hf => Box::new(HfEngine::open_training(a, &t)?),
        EngineKind::Llmc => Box::new(LlmcEngine::start(LlmcSetup {
            opts: a.llmc,
            model: a.model,
            weights: a.weights,
            precision: a.precision,
            device: a.device,
            hyper: t.hyper,
            batch_size: t.batch_size,
            block_size: t.block_size,
            train_blocks: t.train_blocks,
            eval_blocks: t.eval_blocks,
        })?),
        EngineKind::Both => return Err(unsupported(kind, Capability::Train)),
    })
}

/// `--save-weights` where the engine generates the weights itself (random ones); read from a
/// checkpoint, they were written where they came from.
fn random_weights_to<'a>(a: &EngineArgs<'a>) -> Option<&'a Path> {
    a.save_weights
        .filter(|_| matches!(a.weights, WeightSource::Random { .. }))
}

/// The candle engine for inference, its `--fused` paths switched on (the kernels read them
/// process-wide, as the matmul precision mode).
fn candle(a: &EngineArgs, save: Option<&Path>) -> Result<CandleEngine> {
    crate::kernels::set_enabled(a.fused);
    let from = LoadFrom {
        weights: a.weights,
        tp: a.tp,
        save,
        progress: a.progress,
    };
    CandleEngine::load(a.model, from, a.precision, rank_device(a)?)
}

/// The device an in-process engine opens on (the skeleton opens it for engines that run here).
fn rank_device(a: &EngineArgs) -> Result<candle_core::Device> {
    a.rank_device.clone().ok_or_else(|| {
        Error::Engine(
            "an in-process engine was opened without its device (EngineArgs::rank_device)".into(),
        )
    })
}

fn unsupported(kind: EngineKind, cap: Capability) -> Error {
    supports(kind, cap).err().unwrap_or_else(|| {
        Error::Config(format!(
            "--engine {} opens one engine at a time",
            kind.as_str()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each engine is declared once, `both` runs the two that score, and a capability an
    /// engine lacks is a one-line error naming the engines that have it.
    #[test]
    fn the_registry_declares_each_engine_and_refuses_what_it_lacks() {
        for e in &ENGINES {
            assert_eq!(entry(e.kind).kind, e.kind);
        }
        assert_eq!(runs(EngineKind::Both), [EngineKind::Candle, EngineKind::Hf]);
        assert!(supports(EngineKind::Both, Capability::Generate).is_ok());
        assert!(supports(EngineKind::Llmc, Capability::Train).is_ok());
        let err = supports(EngineKind::Llmc, Capability::Score)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--engine llmc does not run scoring suites: use --engine candle or hf"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }
}
