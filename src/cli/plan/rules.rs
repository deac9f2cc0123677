//! The flag rules that refuse a bad combination before anything loads: HF / llm.c flags
//! without their engine, llm.c's limits, and what parallel runs (`--tp`, `--dp`, ZeRO) take.

use super::matrix::Plan;
use crate::cli::RunArgs;
use crate::device::{DeviceSpec, Precision};
use crate::engines::hf::{HfAttn, HfCompile};
use crate::engines::llmc::{setup as llmc_setup, LlmcOptions};
use crate::engines::EngineKind;
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::scenarios::suite_file::SuiteFile;
use crate::scenarios::{RunSpec, Workload};

/// Whether `args` or the suite file's `[sweep]` name one of `kinds`.
pub(super) fn names_engine(args: &RunArgs, suite: &SuiteFile, kinds: &[EngineKind]) -> bool {
    let names = |e: &str| kinds.iter().any(|k| k.as_str() == e);
    args.engines.iter().any(|e| kinds.contains(e))
        || suite
            .sweep
            .engines
            .as_ref()
            .is_some_and(|e| e.iter().any(|e| names(e)))
}

/// Flags that only make sense with another: HF options without the HF engine, `--llmc-bin`
/// without llm.c, `--save-weights` without random weights, `--limit 0`.
pub(super) fn check_flags(args: &RunArgs, suite: &SuiteFile, weights: &WeightSource) -> Result<()> {
    let uses_hf = names_engine(args, suite, &[EngineKind::Hf, EngineKind::Both]);
    let hf_flags = args.hf_compile != HfCompile::Best
        || args.hf_attn != HfAttn::Best
        || args.hf_config.is_some();
    if !uses_hf && (hf_flags || args.python.is_some()) {
        return Err(Error::Config(
            "--python, --hf-attn, --hf-compile and --hf-config are for --engine hf or both".into(),
        ));
    }
    if args.llmc_bin.is_some() && !names_engine(args, suite, &[EngineKind::Llmc]) {
        return Err(Error::Config("--llmc-bin is for --engine llmc".into()));
    }
    if args.save_weights.is_some() && !matches!(weights, WeightSource::Random { .. }) {
        return Err(Error::Config(
            "--save-weights writes random weights: use it with --weights random".into(),
        ));
    }
    if args.limit == Some(0) {
        return Err(Error::Config("--limit must be at least 1".into()));
    }
    Ok(())
}

/// `--engine llmc`: a training suite, a model, precision, device and weights llm.c's
/// default build runs, no per-phase times, and its binary (checked before anything runs).
pub(super) fn check_llmc(
    args: &RunArgs,
    workload: &Workload,
    model: &ModelSpec,
    precision: Precision,
    device: DeviceSpec,
    weights: &WeightSource,
) -> Result<()> {
    let Workload::Train(opts) = workload else {
        return Err(Error::Config(
            "--engine llmc trains (llm.c's train_gpt2cu): use it with --suite wikitext2".into(),
        ));
    };
    if opts.phase_times {
        return Err(Error::Config(
            "--phase-times splits candle's and HF's steps; llm.c reports whole steps: drop it for --engine llmc".into(),
        ));
    }
    llmc_setup::check(model, precision, device, weights)?;
    LlmcOptions {
        bin: args.llmc_bin.clone(),
    }
    .binary()
    .map(|_| ())
}

/// `--tp N` or `--dp N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallel {
    Tensor(usize),
    Data {
        size: usize,
        zero: crate::train::ZeroStage,
        /// `--dp-overlap`.
        overlap: bool,
    },
}

impl Parallel {
    pub fn size(self) -> usize {
        match self {
            Parallel::Tensor(n) | Parallel::Data { size: n, .. } => n,
        }
    }

    pub fn flag(self) -> &'static str {
        match self {
            Parallel::Tensor(_) => "--tp",
            Parallel::Data { .. } => "--dp",
        }
    }
}

/// The parallel mode of `args`, checked against the plan: one configuration, the candle
/// engine, the right kind of suite, a CUDA build with NCCL for GPUs. None without `--tp`/`--dp`.
pub fn parallel(args: &RunArgs, plan: &Plan) -> Result<Option<Parallel>> {
    // A `--strategies` configuration brings its own level.
    let zero = plan.configs[0].zero.unwrap_or(args.zero);
    let par = match (args.tp, args.dp) {
        (1, 1) if zero != 0 => return Err(Error::Config("--zero is for --dp runs".into())),
        (1, 1) if args.dp_overlap => {
            return Err(Error::Config("--dp-overlap is for --dp runs".into()))
        }
        (1, 1) => return Ok(None),
        (tp, 1) => Parallel::Tensor(tp),
        (1, dp) => Parallel::Data {
            size: dp,
            zero: crate::train::ZeroStage::from_level(zero).expect("clap keeps --zero in 0..=3"),
            overlap: args.dp_overlap,
        },
        _ => {
            return Err(Error::Config(
                "--tp and --dp cannot be combined yet: use one of them".into(),
            ))
        }
    };
    let flag = par.flag();
    let not_with = |what: &str| Err(Error::Config(format!("{flag} is not supported {what}")));
    if plan.sweep {
        return not_with(
            "in a sweep (one configuration at a time; --repeat and --isolate included)",
        );
    }
    let training = plan.suite.train.is_some();
    // The HF engine's strategies run under torchrun, which its engine starts: one process here.
    let hf = plan.configs[0].engine == EngineKind::Hf;
    if hf && training && matches!(par, Parallel::Data { .. }) {
        return Ok(None);
    }
    if plan.configs[0].engine != EngineKind::Candle {
        return not_with("with --engine hf or both (the candle engine only; --engine hf --dp N trains under torchrun)");
    }
    if args.save_weights.is_some() {
        return not_with("with --save-weights (write the weights with a single-process run)");
    }
    if matches!(par, Parallel::Tensor(_)) && training {
        return not_with("for training suites (LAMBADA only; data parallelism is --dp)");
    }
    if matches!(par, Parallel::Data { .. }) && !training {
        return not_with(&format!(
            "for --suite {} (it is for training suites: --suite wikitext2; for inference use --tp)",
            plan.suite.name
        ));
    }
    if zero != 0 && !matches!(par, Parallel::Data { .. }) {
        return Err(Error::Config("--zero is for --dp runs".into()));
    }
    if zero >= 2 && args.dp_overlap {
        return Err(Error::Config(
            "--zero 2 and 3 reduce-scatter each block's gradients as the backward makes them: drop --dp-overlap".into(),
        ));
    }
    Ok(Some(par))
}

/// What a parallel run needs of the spec and the device flag: at least one rank, heads that
/// split (`--tp`), `--device cuda` (each rank takes cuda:LOCAL_RANK), NCCL for GPUs.
pub fn check_parallel(par: Parallel, spec: &RunSpec) -> Result<()> {
    use crate::device::DeviceSpec;
    let (n, flag) = (par.size(), par.flag());
    if n == 0 {
        return Err(Error::Config(format!("{flag} must be at least 1")));
    }
    if let Parallel::Tensor(n) = par {
        spec.model.check_tp(n)?;
    }
    if let DeviceSpec::Cuda(n @ 1..) = spec.device {
        return Err(Error::Config(format!(
            "--device cuda:{n} with {flag}: each rank uses cuda:LOCAL_RANK; pick GPUs with CUDA_VISIBLE_DEVICES and pass --device cuda"
        )));
    }
    if matches!(spec.device, DeviceSpec::Cuda(_)) && !cfg!(feature = "nccl") {
        return Err(Error::Unsupported(crate::dist::group::NO_NCCL.into()));
    }
    check_zero3(par, spec)
}

/// `--zero 3` gathers blocks inside GPT-2's manual step, and its weights exist whole nowhere:
/// refused before any rank starts for another backward and for `--save`.
pub(super) fn check_zero3(par: Parallel, spec: &RunSpec) -> Result<()> {
    use crate::train::{Backward, ZeroStage};
    let (
        Parallel::Data {
            zero: ZeroStage::Parameters,
            ..
        },
        Workload::Train(opts),
    ) = (par, &spec.workload)
    else {
        return Ok(());
    };
    let backward = opts.backward.unwrap_or(Backward::default_for(&spec.model));
    if backward != Backward::Manual {
        return Err(Error::Unsupported(format!(
            "--zero 3 gathers each block's weights inside GPT-2's manual step; {} trains with --backward {}: use --zero 2 (or 1)",
            spec.model.name,
            backward.as_str()
        )));
    }
    if opts.save.is_some() {
        return Err(Error::Config(
            "--save with --zero 3: no rank holds the whole weights; save from a --zero 0, 1 or 2 run".into(),
        ));
    }
    Ok(())
}
