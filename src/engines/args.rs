//! What a scenario hands the registry to open an engine ([`super::registry`]), in the
//! engines' own terms: the scenario fills these from its run.

use super::hf::HfOptions;
use super::llmc::LlmcOptions;
use crate::device::{DeviceSpec, Precision};
use crate::dist::Tp;
use crate::models::{ModelSpec, WeightSource};
use crate::record::Hyper;
use crate::train::{Backward, DataParallel};
use candle_core::Device;
use std::path::Path;

/// What any engine needs to open, in the engines' terms (a scenario fills it from its run).
pub struct EngineArgs<'a> {
    pub model: &'a ModelSpec,
    pub weights: &'a WeightSource,
    pub precision: Precision,
    pub device: DeviceSpec,
    /// The in-process engine's device: its tensor- or data-parallel rank's, else `--device`'s.
    /// None where the engine runs in a child process (no CUDA context is opened here).
    pub rank_device: Option<Device>,
    pub tp: Option<&'a Tp>,
    /// `--save-weights`: the in-process engine also writes the random weights there.
    pub save_weights: Option<&'a Path>,
    pub progress: bool,
    pub seed: u64,
    pub hf: &'a HfOptions,
    pub llmc: &'a LlmcOptions,
    /// `--fused`: the fused CUDA paths an in-process engine switches on as it opens.
    pub fused: &'a [crate::kernels::Fused],
}

/// What a training engine needs besides [`EngineArgs`].
pub struct TrainArgs<'a> {
    pub hyper: &'a Hyper,
    pub dropout: bool,
    pub backward: Option<Backward>,
    pub recompute: crate::train::Recompute,
    pub phase_times: bool,
    /// In-process data parallelism (`--dp`): this rank's group.
    pub dp: Option<DataParallel>,
    /// A child engine's own data parallelism (HF under torchrun): ranks and strategy.
    pub child_parallel: Option<(usize, &'static str)>,
    pub batch_size: usize,
    pub block_size: usize,
    pub train_blocks: &'a [Vec<u32>],
    pub eval_blocks: &'a [Vec<u32>],
}
