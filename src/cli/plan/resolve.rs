//! One configuration resolved into its [`RunSpec`]: the model and its weights, the data, the
//! workload and its options (generation lengths, training hyper-parameters, HF's settings).

use super::matrix::{Plan, RunConfig};
use super::rules::{check_flags, check_llmc};
use crate::cli::RunArgs;
use crate::data::{find_or_download, find_or_download_dir, DataFile, Lookup, Reference};
use crate::device::{DeviceSpec, Precision};
use crate::engines::hf::{HfAttn, HfCompile, HfOptions};
use crate::engines::llmc::LlmcOptions;
use crate::engines::EngineKind;
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::scenarios::passes::MinRun;
use crate::scenarios::skeleton::max_positions;
use crate::scenarios::suite_file::{SuiteFile, SuiteTrain};
use crate::scenarios::train::data::{Splits, WIKITEXT2_RAW};
use crate::scenarios::train::shakespeare;
use crate::scenarios::{
    GenerateOptions, GenerateSource, HfParallel, RunSpec, TrainOptions, Workload,
};
use crate::train::Recompute;
use std::path::PathBuf;

/// `--data`: the embedded sample (none given), the suite's full file found locally (`full`),
/// or a path.
pub(super) fn resolve_data(arg: Option<&str>, suite: &SuiteFile) -> Result<DataFile> {
    match arg {
        None => Ok(DataFile::embedded_lambada_sample()),
        // A member of the WikiText-2 zip (the generation suite's text): its folder found or
        // downloaded and extracted.
        Some("full") if suite.data.url == WIKITEXT2_RAW.url => {
            let dir = find_or_download_dir(&WIKITEXT2_RAW, &Lookup::from_env())?;
            DataFile::read(&dir.join(&suite.data.file), &suite.data_hint())
        }
        // Found locally, else downloaded (checksum-verified) into the cache when online.
        Some("full") => {
            let hint = suite.data_hint();
            let reference = Reference {
                file: &suite.data.file,
                url: &suite.data.url,
                sha256: &suite.data.sha256,
                hint: &hint,
            };
            find_or_download(&reference, &Lookup::from_env())
        }
        Some(path) => DataFile::read(&PathBuf::from(path), &suite.data_hint()),
    }
}

/// `--weights`, given `--model-dir`: random (the default without a dir) or the checkpoint.
pub(super) fn weight_source(args: &RunArgs, checkpoint: Option<&PathBuf>) -> Result<WeightSource> {
    use crate::cli::WeightsKind;
    match (args.weights, checkpoint) {
        (Some(WeightsKind::Random), _) | (None, None) => {
            Ok(WeightSource::Random { seed: args.seed })
        }
        (_, Some(dir)) => Ok(WeightSource::Dir(dir.clone())),
        (Some(WeightsKind::Checkpoint), None) => Err(Error::Config(
            "--weights checkpoint needs --model-dir DIR or --model ORG/NAME".into(),
        )),
    }
}

/// HF's attention and torch.compile as asked: `--hf-config`, else `--hf-attn` and `--hf-compile`.
pub(super) fn hf_config(args: &RunArgs) -> (HfAttn, HfCompile) {
    args.hf_config.unwrap_or((args.hf_attn, args.hf_compile))
}

/// torch.compile asked for outright (`--hf-compile`, `--hf-config …+compile`), not left to
/// the probe.
pub(super) fn compile_on(args: &RunArgs) -> bool {
    hf_config(args).1 == HfCompile::On
}

/// `--pad-multiple`: given, else 64 with `--hf-compile` (one compilation per bucket of 64
/// positions, in the warm-up) and 1 without. Training blocks all have one length.
pub(super) fn pad_multiple(args: &RunArgs, suite: &SuiteFile) -> Result<usize> {
    match args.pad_multiple {
        Some(0) => Err(Error::Config(
            "--pad-multiple must be at least 1 (1 pads each batch to its longest row)".into(),
        )),
        Some(_) if suite.train.is_some() => Err(Error::Config(format!(
            "--pad-multiple is for LAMBADA and generation: --suite {}'s blocks all have one length",
            suite.name
        ))),
        Some(n) => Ok(n),
        None if compile_on(args) => Ok(64),
        None => Ok(1),
    }
}

/// The workload of `suite`: training options for a training suite (and a refusal of training
/// flags anywhere else), generation for the generation suite or `--mode generate`, LAMBADA
/// scoring otherwise.
pub(super) fn workload(args: &RunArgs, suite: &SuiteFile, config: &RunConfig) -> Result<Workload> {
    let generate = args.mode == crate::cli::Mode::Generate;
    if generate && suite.name != "lambada" {
        return Err(Error::Config(format!(
            "--mode generate is for --suite lambada; --suite {} has its own workload",
            suite.name
        )));
    }
    if args.acc_threshold.is_some() && !generate {
        return Err(Error::Config(
            "--acc-threshold is for --suite lambada --mode generate".into(),
        ));
    }
    if let (Some(flag), None) = (args.train.given(), &suite.train) {
        return Err(Error::Config(format!(
            "{flag} is a training option: it applies to --suite wikitext2 or shakespeare, not {}",
            suite.name
        )));
    }
    let serve = super::serve::serve_options(args, suite, config.request_rate)?;
    if let Some(t) = &suite.train {
        let opts = resolve_train(args, suite, t, config)?;
        return Ok(Workload::Train(opts));
    }
    if let Some(opts) = serve {
        return Ok(Workload::Serve(opts));
    }
    let source = match (&suite.generation, generate) {
        (Some(_), _) => text_source(args, suite, config)?,
        (None, true) => GenerateSource::Lambada,
        (None, false) => return Ok(Workload::Score),
    };
    Ok(Workload::Generate(GenerateOptions {
        source,
        acc_threshold: args.acc_threshold,
    }))
}

/// The generation suite's prompts: cut from `--data` (a text file) or the embedded WikiText-2
/// test sample, at the configuration's prompt length.
pub(super) fn text_source(
    args: &RunArgs,
    suite: &SuiteFile,
    config: &RunConfig,
) -> Result<GenerateSource> {
    let (text, origin) = match args.data.as_deref() {
        None => (
            crate::scenarios::train::data::SAMPLE_EVAL.to_string(),
            "embedded:wikitext2_sample/wiki.test.raw".to_string(),
        ),
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| Error::io(format!("reading --data {p}"), e))?,
            p.to_string(),
        ),
    };
    let model = model_spec(args, config)?;
    let (prompt_len, new_tokens) = (
        config.seq_len.unwrap_or(128),
        config.new_tokens.unwrap_or(128),
    );
    crate::models::generate::check_lengths(prompt_len, new_tokens, max_positions(&model))?;
    Ok(GenerateSource::Text {
        text,
        origin,
        prompt_len,
        new_tokens,
        batches: args.limit.unwrap_or(suite.run.timed_batches.unwrap_or(10)),
    })
}

/// The configuration's model and its checkpoint directory: `--model-dir`, an HF hub id
/// (`ORG/NAME[@REV]`, from the HF cache, downloaded into it when online), or a preset (none).
pub fn model_source(args: &RunArgs, config: &RunConfig) -> Result<(ModelSpec, Option<PathBuf>)> {
    match &args.model_dir {
        Some(dir) => Ok((ModelSpec::from_dir(dir)?, Some(dir.clone()))),
        None if crate::hub::is_hub_id(&config.model) => {
            let resolved = crate::hub::resolve_model(&config.model)?;
            Ok((resolved.spec()?, Some(resolved.dir)))
        }
        None => Ok((ModelSpec::preset(&config.model)?, None)),
    }
}

pub(super) fn model_spec(args: &RunArgs, config: &RunConfig) -> Result<ModelSpec> {
    model_source(args, config).map(|(spec, _)| spec)
}

/// The run of one configuration of `args`' plan.
pub fn resolve_config(
    args: &RunArgs,
    plan: &Plan,
    config: &RunConfig,
    repeat: Option<usize>,
    command_line: Vec<String>,
) -> Result<RunSpec> {
    let (suite, plan_device) = (&plan.suite, plan.device);
    let (model, checkpoint) = model_source(args, config)?;
    let weights = weight_source(args, checkpoint.as_ref())?;
    check_flags(args, suite, &weights)?;
    let workload = workload(args, suite, config)?;
    if config.engine == EngineKind::Llmc {
        check_llmc(
            args,
            &workload,
            &model,
            config.precision,
            plan_device,
            &weights,
        )?;
    }
    crate::engines::registry::supports(config.engine, workload.capability())?;
    let warmup_batches = args.warmup.unwrap_or(suite.run.warmup_batches);
    if compile_on(args) && warmup_batches == 0 && matches!(workload, Workload::Train(_)) {
        return Err(Error::Config(
            "--hf-compile compiles in the first training step: keep --warmup at 1 or more, so compilation is reported, not timed".into(),
        ));
    }
    check_training(config, &model, &workload)?;
    check_fp8(args, config, &workload)?;
    let data = run_data(args, suite, &workload)?;
    Ok(RunSpec {
        seed: args.seed,
        min_run: min_run(args, &workload, plan_device)?,
        workload,
        warmup_batches,
        suite: suite.clone(),
        model,
        weights,
        tokenizer_dir: checkpoint,
        device: plan_device,
        precision: config.precision,
        batch_size: config.batch_size,
        limit: args.limit,
        seq_len: config.seq_len,
        pad_multiple: pad_multiple(args, suite)?,
        repeat,
        data,
        log_dir: args.log_dir.clone(),
        save_weights: args.save_weights.clone(),
        engine: config.engine,
        hf: HfOptions {
            python: args.python.clone(),
            attn: hf_config(args).0,
            compile: hf_config(args).1,
            worker: args.hf_worker.clone(),
        },
        llmc: LlmcOptions {
            bin: args.llmc_bin.clone(),
        },
        command_line,
        progress: !args.no_progress,
        fused: args.fused.clone(),
        tp: None,
        dp: None,
        auto: plan.auto.clone(),
    })
}

/// `--min-time` and `--min-batches` against the device's defaults; refused for training, which
/// runs its steps (`--max-steps`, `--epochs`).
fn min_run(args: &RunArgs, workload: &Workload, device: DeviceSpec) -> Result<MinRun> {
    let given = args.min_time.is_some() || args.min_batches.is_some();
    if given && matches!(workload, Workload::Train(_)) {
        return Err(Error::Config(
            "--min-time and --min-batches are for scoring and generation: a training run times its steps (--max-steps, --epochs)".into(),
        ));
    }
    if let Some(s) = args.min_time.filter(|s| !(s.is_finite() && *s >= 0.)) {
        return Err(Error::Config(format!(
            "--min-time {s}: give seconds, 0 or more"
        )));
    }
    Ok(MinRun::resolve(device, args.min_time, args.min_batches))
}

/// Training's checks that need the model, before any weights load: its backward, and
/// `--recompute` only with candle's manual step.
fn check_training(config: &RunConfig, model: &ModelSpec, workload: &Workload) -> Result<()> {
    let Workload::Train(opts) = workload else {
        return Ok(());
    };
    let backward = opts
        .backward
        .unwrap_or(crate::train::Backward::default_for(model));
    backward.check(model)?;
    let candle = config.engine == EngineKind::Candle;
    if candle && opts.recompute != Recompute::Off && backward != crate::train::Backward::Manual {
        return Err(Error::Config(format!(
            "--recompute checkpoints the blocks of the manual step (GPT-2, --backward manual); {} trains with --backward {}",
            model.name,
            backward.as_str()
        )));
    }
    Ok(())
}

/// `--dtype fp8`: the candle engine's inference on one GPU (or the CPU).
fn check_fp8(args: &RunArgs, config: &RunConfig, workload: &Workload) -> Result<()> {
    if config.precision != Precision::Fp8 {
        return Ok(());
    }
    if config.engine != EngineKind::Candle {
        return Err(Error::Config(format!(
            "--dtype fp8 is the candle engine's fp8 weights; --engine {} has no fp8 path here: run it at --dtype bf16 beside candle's fp8",
            config.engine.as_str()
        )));
    }
    if matches!(workload, Workload::Train(_)) {
        return Err(Error::Config(
            "--dtype fp8 is for inference: train in bf16 with --save DIR, then run --model-dir DIR --dtype fp8".into(),
        ));
    }
    if args.tp > 1 {
        return Err(Error::Config(
            "--dtype fp8 under --tp is not built: drop --tp, or run --dtype bf16".into(),
        ));
    }
    Ok(())
}

/// The data file a run reads: LAMBADA (`--data`) for scoring and its generation mode; training
/// and text generation read their own, and get the embedded sample as a placeholder.
fn run_data(args: &RunArgs, suite: &SuiteFile, workload: &Workload) -> Result<DataFile> {
    match workload {
        Workload::Train(_)
        | Workload::Serve(_)
        | Workload::Generate(GenerateOptions {
            source: GenerateSource::Text { .. },
            ..
        }) => Ok(DataFile::embedded_lambada_sample()),
        Workload::Score | Workload::Generate(_) => resolve_data(args.data.as_deref(), suite),
    }
}

pub(super) fn resolve_train(
    args: &RunArgs,
    suite: &SuiteFile,
    t: &SuiteTrain,
    config: &RunConfig,
) -> Result<TrainOptions> {
    let (batch_size, engine) = (config.batch_size, config.engine);
    let a = &args.train;
    if engine == EngineKind::Hf && a.backward.is_some() {
        return Err(Error::Config(
            "--backward picks how the candle engine computes gradients: use it with --engine candle or both".into(),
        ));
    }
    if engine == EngineKind::Llmc && config.recompute != Recompute::Off {
        let engines = match config.recompute {
            Recompute::Mlp => "--engine candle",
            _ => "--engine candle or hf",
        };
        return Err(Error::Config(format!(
            "--recompute checkpoints candle's manual step or HF's blocks (llm.c's recompute is not wired in): use it with {engines}"
        )));
    }
    let hf_parallel = match (engine, args.dp) {
        (EngineKind::Hf, n) if n > 1 => Some(hf_parallel(args, config, n)?),
        _ => None,
    };
    if engine != EngineKind::Candle && a.save.is_some() {
        return Err(Error::Config(
            "--save writes the candle engine's trained weights: use it with --engine candle".into(),
        ));
    }
    if args.limit.is_some() {
        return Err(Error::Config(
            "--limit is for LAMBADA; use --max-steps".into(),
        ));
    }
    let splits = match (suite.name.as_str(), args.data.as_deref()) {
        ("shakespeare", Some("full")) => {
            let full = resolve_data(Some("full"), suite)?;
            shakespeare::splits_of(full.origin, full.text)
        }
        ("shakespeare", _) if a.eval_data.is_some() => {
            return Err(Error::Config(
                "--eval-data is for --suite wikitext2: Tiny Shakespeare evaluates on its first tokens (llm.c's split)".into(),
            ))
        }
        ("shakespeare", data) => shakespeare::splits(data.map(std::path::Path::new))?,
        (_, None) => Splits::sample(),
        // Found locally, else downloaded and extracted (each file checksum-verified) when online.
        (_, Some("full")) => {
            let dir = find_or_download_dir(&WIKITEXT2_RAW, &Lookup::from_env())?;
            Splits::from_path(&dir, a.eval_data.as_deref())?
        }
        (_, Some(p)) => Splits::from_path(std::path::Path::new(p), a.eval_data.as_deref())?,
    };
    let grad_accum = a.grad_accum.unwrap_or(t.grad_accum);
    if grad_accum == 0 || a.max_steps == Some(0) || a.epochs.is_some_and(|e| e <= 0.) {
        return Err(Error::Config(
            "--grad-accum, --max-steps and --epochs must be positive".into(),
        ));
    }
    Ok(TrainOptions {
        splits,
        block_size: a.block_size,
        epochs: a.epochs.unwrap_or(t.epochs),
        max_steps: a.max_steps,
        grad_accum,
        learning_rate: a.lr.unwrap_or(t.learning_rate),
        lr_warmup_steps: a.lr_warmup_steps.unwrap_or(t.lr_warmup_steps),
        eval_batch_size: batch_size,
        dropout: !a.no_dropout,
        backward: a.backward,
        phase_times: a.phase_times,
        drop_last: a.drop_last || compile_on(args),
        recompute: config.recompute,
        save: a.save.clone(),
        hf_parallel,
    })
}

/// `--engine hf --dp N`: the HF engine's strategy for the configuration's ZeRO level (DDP,
/// FSDP's SHARD_GRAD_OP or FULL_SHARD under torchrun).
pub(super) fn hf_parallel(args: &RunArgs, config: &RunConfig, size: usize) -> Result<HfParallel> {
    use crate::train::ZeroStage;
    let zero = config.zero.unwrap_or(args.zero);
    if zero == 1 {
        return Err(Error::Config(
            "--engine hf runs --zero 0 (DDP), 2 (FSDP SHARD_GRAD_OP) and 3 (FSDP FULL_SHARD); ZeRO-1 has no FSDP strategy".into(),
        ));
    }
    if compile_on(args) || args.dp_overlap {
        return Err(Error::Config(
            "--engine hf --dp runs DDP / FSDP eager: drop --hf-compile and --dp-overlap".into(),
        ));
    }
    Ok(HfParallel {
        size,
        zero: ZeroStage::from_level(zero).expect("clap keeps --zero in 0..=3"),
    })
}
