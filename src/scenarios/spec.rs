//! What one run is, fully resolved from flags and the suite file: the typed plan a scenario
//! receives. The CLI builds it ([`crate::cli::plan`]); launchers decide in which process it
//! runs; scenarios run it.

use crate::data::DataFile;
use crate::device::{DeviceSpec, Precision};
use crate::dist::group::RankContext;
use crate::engines::hf::HfOptions;
use crate::engines::llmc::LlmcOptions;
use crate::engines::EngineKind;
use crate::models::{ModelSpec, WeightSource};
use crate::scenarios::suite_file::SuiteFile;
use crate::scenarios::train::data::Splits;
use std::path::PathBuf;

/// Everything a run needs, resolved from flags and the suite file.
pub struct RunSpec {
    pub suite: SuiteFile,
    /// What is run: LAMBADA scoring or training.
    pub workload: Workload,
    pub model: ModelSpec,
    pub weights: WeightSource,
    pub tokenizer_dir: Option<PathBuf>,
    pub device: DeviceSpec,
    pub precision: Precision,
    pub batch_size: usize,
    pub warmup_batches: usize,
    /// `--min-time`, `--min-batches`: scoring and generation time whole passes over their
    /// batches until both are reached (training runs its steps).
    pub min_run: crate::scenarios::passes::MinRun,
    pub limit: Option<usize>,
    /// Left-truncate contexts to this many tokens (None: the model's maximum).
    pub seq_len: Option<usize>,
    /// `--pad-multiple`: scoring batches and generation prompts are padded to a multiple of
    /// this many positions (1: to their longest row).
    pub pad_multiple: usize,
    /// Repeat index when a sweep runs this configuration several times.
    pub repeat: Option<usize>,
    pub data: DataFile,
    pub log_dir: PathBuf,
    /// Write the random weights as an HF checkpoint here.
    pub save_weights: Option<PathBuf>,
    pub engine: EngineKind,
    pub hf: HfOptions,
    /// `--llmc-bin`: llm.c's train_gpt2cu (`--engine llmc`).
    pub llmc: LlmcOptions,
    /// `--fused`: the candle engine's fused CUDA paths, switched on as it opens.
    pub fused: Vec<crate::kernels::Fused>,
    pub command_line: Vec<String>,
    pub progress: bool,
    /// `--seed`: random weights and, for training, the data order.
    pub seed: u64,
    /// This process is one rank of a tensor-parallel group (`--tp N`).
    pub tp: Option<RankContext>,
    /// This process is one rank of a data-parallel training group (`--dp N`).
    pub dp: Option<DpRun>,
    /// What `--device auto` / `--dtype auto` chose and why.
    pub auto: Option<String>,
}

/// The workload of a run; each has its scenario module.
#[derive(Clone, Debug)]
pub enum Workload {
    /// LAMBADA scored like lm-eval ([`crate::scenarios::lambada`]).
    Score,
    /// Greedy generation ([`crate::scenarios::generate`]).
    Generate(GenerateOptions),
    /// Causal-LM training ([`crate::scenarios::wikitext2`]).
    Train(TrainOptions),
    /// Requests arriving over time, batched as they arrive ([`crate::scenarios::serving`]).
    Serve(ServeOptions),
}

impl Workload {
    /// What it asks of an engine.
    pub fn capability(&self) -> crate::engines::registry::Capability {
        use crate::engines::registry::Capability;
        match self {
            Workload::Score => Capability::Score,
            Workload::Generate(_) => Capability::Generate,
            Workload::Train(_) => Capability::Train,
            Workload::Serve(_) => Capability::Serve,
        }
    }
}

/// What a generation run generates from.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerateSource {
    /// LAMBADA passages (`--suite lambada --mode generate`): FasterTransformer's bloom_lambada.
    Lambada,
    /// Prompts of `prompt_len` tokens cut from a text, `new_tokens` each (`--suite generation`).
    Text {
        text: String,
        origin: String,
        prompt_len: usize,
        new_tokens: usize,
        /// Timed calls (after the warm-up ones).
        batches: usize,
    },
}

/// Generation flags, resolved against the suite file.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub source: GenerateSource,
    /// `--acc-threshold`: exit non-zero when the accuracy is below it (FT's CI gate).
    pub acc_threshold: Option<f64>,
}

/// Serving flags, resolved against the suite file: the load, and the goodput's limits.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub load: crate::scenarios::serving::load::LoadSpec,
    /// `--slo`: None, no goodput.
    pub slo: Option<crate::metrics::serving::Slo>,
    /// `--batching`: continuous (slots) or static (calls).
    pub batching: crate::engines::replay::Batching,
}

/// Training flags, resolved against the suite file.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub splits: Splits,
    /// None: min(1024, n_positions), as run_clm.
    pub block_size: Option<usize>,
    pub epochs: f64,
    /// Overrides `epochs` (HF `max_steps`).
    pub max_steps: Option<usize>,
    pub grad_accum: usize,
    pub learning_rate: f64,
    pub lr_warmup_steps: usize,
    pub eval_batch_size: usize,
    pub dropout: bool,
    /// The candle engine's gradients (`--backward`); None: the model's default.
    pub backward: Option<crate::train::Backward>,
    /// Synchronize between forward, backward and update and log each one's time.
    pub phase_times: bool,
    /// Drop each epoch's last partial batch (HF's dataloader_drop_last).
    pub drop_last: bool,
    /// What candle's manual step keeps of each block (`--recompute`).
    pub recompute: crate::train::Recompute,
    /// Write the trained weights (fp32 masters) as an HF checkpoint here.
    pub save: Option<PathBuf>,
    /// The HF engine over `--dp N` GPUs (torchrun, DDP or FSDP), else None.
    pub hf_parallel: Option<HfParallel>,
}

/// The HF engine's training strategy over several GPUs: one torchrun worker a GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HfParallel {
    pub size: usize,
    /// The ZeRO stage it stands for: 0 DDP, 2 FSDP's SHARD_GRAD_OP, 3 FSDP's FULL_SHARD.
    pub zero: crate::train::ZeroStage,
}

impl HfParallel {
    /// What the worker is told (`worker.py`'s `parallel.strategy`).
    pub fn strategy(self) -> &'static str {
        use crate::train::ZeroStage;
        match self.zero {
            ZeroStage::Off => "ddp",
            ZeroStage::Parameters => "fsdp_full",
            _ => "fsdp_grad_op",
        }
    }
}

/// A data-parallel rank: its group, and whether the optimizer state is split (ZeRO-1).
#[derive(Clone)]
pub struct DpRun {
    pub ctx: RankContext,
    /// `--zero`: what the ranks split.
    pub zero: crate::train::ZeroStage,
    /// `--dp-overlap`: the gradients' all-reduce started block by block under the backward.
    pub overlap: bool,
}

impl RunSpec {
    /// Rank of this process in its tensor- or data-parallel group (0 without one).
    pub fn rank(&self) -> usize {
        match (&self.tp, &self.dp) {
            (Some(t), _) => t.group.rank,
            (_, Some(d)) => d.ctx.group.rank,
            _ => 0,
        }
    }

    /// Whether this process writes the log and prints results: rank 0 only.
    pub fn is_logging_rank(&self) -> bool {
        self.rank() == 0
    }

    /// Ranks of the data-parallel group (1 without `--dp`).
    pub fn dp_size(&self) -> usize {
        self.dp.as_ref().map_or(1, |d| d.ctx.group.size)
    }

    /// GPUs (or processes) the run's work is spread over: the tensor- or data-parallel group.
    pub fn devices(&self) -> usize {
        match (&self.tp, &self.dp) {
            (Some(t), _) => t.group.size,
            (_, Some(d)) => d.ctx.group.size,
            _ => 1,
        }
    }
}
