//! From flags to a typed plan: the suite, the configurations of its matrix (model × dtype ×
//! seq-len × batch size × engine) and whether they run as a sweep of child processes; then,
//! per configuration, the fully resolved [`RunSpec`]. Every flag rule lives here, so a bad
//! combination fails before anything is loaded.

use super::{DeviceArg, DtypeArg, RunArgs};
use crate::data::{find_or_download, find_or_download_dir, DataFile, Lookup, Reference};
use crate::device::{choose_auto, visible_gpus, AutoChoice, DeviceSpec, Precision};
use crate::engines::hf::{HfAttn, HfCompile, HfOptions};
use crate::engines::llmc::{setup as llmc_setup, LlmcOptions};
use crate::engines::EngineKind;
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::record::SweepConfig;
use crate::scenarios::shakespeare;
use crate::scenarios::skeleton::max_positions;
use crate::scenarios::suite_file::{SuiteFile, SuiteTrain};
use crate::scenarios::wikitext2::data::{Splits, WIKITEXT2_RAW};
use crate::scenarios::{
    GenerateOptions, GenerateSource, HfParallel, RunSpec, TrainOptions, Workload,
};
use clap::ValueEnum;
use std::path::PathBuf;

/// One configuration of the plan: a point of the product, typed. Sweeps carry it to their
/// children (and log it) as the serde [`SweepConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    pub model: String,
    pub precision: Precision,
    pub batch_size: usize,
    /// LAMBADA: contexts left-truncated to this; the generation suite: the prompt length.
    pub seq_len: Option<usize>,
    pub engine: EngineKind,
    /// The generation suite: new tokens per prompt.
    pub new_tokens: Option<usize>,
    /// `--strategies`: the `--zero` level of this configuration's `--dp` ranks.
    pub zero: Option<u8>,
    /// Training: `--recompute` (a sweep axis when given a list).
    pub recompute: bool,
}

impl RunConfig {
    /// As the sweep log records it.
    pub fn record(&self) -> SweepConfig {
        SweepConfig {
            model: self.model.clone(),
            dtype: self.precision.to_string(),
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            engine: self.engine.as_str().into(),
            new_tokens: self.new_tokens,
            zero: self.zero,
            recompute: self.recompute.then_some(true),
        }
    }

    /// A sweep child's configuration, read back from its task.
    pub fn from_record(c: &SweepConfig) -> Result<Self> {
        Ok(Self {
            model: c.model.clone(),
            precision: parse_precision(&c.dtype)?,
            batch_size: c.batch_size,
            seq_len: c.seq_len,
            engine: parse_engine(&c.engine)?,
            new_tokens: c.new_tokens,
            zero: c.zero,
            recompute: c.recompute == Some(true),
        })
    }
}

fn parse_precision(s: &str) -> Result<Precision> {
    <Precision as ValueEnum>::from_str(s, true)
        .map_err(|_| Error::Config(format!("unknown dtype '{s}' (fp32, tf32, fp16, bf16)")))
}

fn parse_dtype(s: &str) -> Result<DtypeArg> {
    <DtypeArg as ValueEnum>::from_str(s, true).map_err(|_| {
        Error::Config(format!(
            "unknown dtype '{s}' (auto, fp32, tf32, fp16, bf16)"
        ))
    })
}

/// `--device`, and whether `auto` chose it or the precision. `--dtype auto` on a device given
/// explicitly: bf16 on a CUDA GPU that has it, fp32 on the CPU.
fn resolve_device(arg: DeviceArg, auto_dtype: bool) -> (DeviceSpec, Option<AutoChoice>) {
    let cuda_built = cfg!(feature = "cuda");
    match arg {
        DeviceArg::Auto => {
            let c = choose_auto(cuda_built, visible_gpus());
            (c.device, Some(c))
        }
        DeviceArg::Spec(DeviceSpec::Cpu) => {
            let why = "auto: fp32 on the CPU".to_string();
            let c = AutoChoice {
                device: DeviceSpec::Cpu,
                precision: Precision::Fp32,
                why,
            };
            (DeviceSpec::Cpu, auto_dtype.then_some(c))
        }
        DeviceArg::Spec(d @ DeviceSpec::Cuda(n)) => {
            let mut c = choose_auto(cuda_built, visible_gpus());
            // Only the precision is auto here: the GPU asked for decides it.
            let major = visible_gpus().ok().and_then(|g| g.get(n).copied());
            c.precision = match major {
                Some(m) if m < 8 => Precision::Fp32,
                _ => Precision::Bf16,
            };
            c.why = format!("auto: {} on {d}", c.precision);
            (d, auto_dtype.then_some(c))
        }
    }
}

fn parse_engine(s: &str) -> Result<EngineKind> {
    <EngineKind as ValueEnum>::from_str(s, true)
        .map_err(|_| Error::Config(format!("unknown engine '{s}' (candle, hf, both, llmc)")))
}

/// What a `bench` invocation runs: its suite, the configurations of its matrix, and whether
/// they run as a sweep of child processes.
pub struct Plan {
    pub suite: SuiteFile,
    /// `--device`, `auto` resolved.
    pub device: DeviceSpec,
    /// What `auto` chose and why (None when nothing was auto).
    pub auto: Option<String>,
    pub configs: Vec<RunConfig>,
    pub repeat: usize,
    pub sweep: bool,
}

/// The lists whose product is a plan.
pub struct Axes {
    pub models: Vec<String>,
    pub precisions: Vec<Precision>,
    pub seq_lens: Vec<Option<usize>>,
    pub new_tokens: Vec<Option<usize>>,
    pub batch_sizes: Vec<usize>,
    /// `--strategies` as ZeRO levels ([None] without it), then `--recompute`'s values.
    pub zeros: Vec<Option<u8>>,
    pub recomputes: Vec<bool>,
    pub engines: Vec<EngineKind>,
}

/// The configurations in run order: models, then dtypes, sequence (prompt) lengths, new
/// tokens, batch sizes, strategies, recompute and engines (innermost, so engines of one
/// configuration run back to back).
pub fn expand(a: &Axes) -> Vec<RunConfig> {
    let mut out = vec![];
    for model in &a.models {
        for &precision in &a.precisions {
            for &seq_len in &a.seq_lens {
                for &new_tokens in &a.new_tokens {
                    for &batch_size in &a.batch_sizes {
                        let base = RunConfig {
                            model: model.clone(),
                            precision,
                            batch_size,
                            seq_len,
                            engine: EngineKind::Candle,
                            new_tokens,
                            zero: None,
                            recompute: false,
                        };
                        out.extend(training_configs(a, base));
                    }
                }
            }
        }
    }
    out
}

/// `base` at each strategy, recompute setting and engine of `a`.
fn training_configs(a: &Axes, base: RunConfig) -> Vec<RunConfig> {
    let mut out = vec![];
    for &zero in &a.zeros {
        for &recompute in &a.recomputes {
            // HF has no ZeRO-1 (FSDP shards gradients with the state): candle runs it alone.
            let engines = a
                .engines
                .iter()
                .filter(|&&e| !(e == EngineKind::Hf && zero == Some(1)));
            for &engine in engines {
                out.push(RunConfig {
                    zero,
                    recompute,
                    engine,
                    ..base.clone()
                });
            }
        }
    }
    out
}

/// Each list comes from its flag, else the suite file's `[sweep]` (parsed here, once), else
/// the default.
fn pick<T: Clone>(flag: &[T], file: Option<Vec<T>>, default: T) -> Vec<T> {
    match (flag, file) {
        ([], Some(f)) => f,
        ([], None) => vec![default],
        (f, _) => f.to_vec(),
    }
}

/// A suite file's list of names, parsed (the first bad name is the error).
fn parse_all<T>(
    names: &Option<Vec<String>>,
    parse: fn(&str) -> Result<T>,
) -> Result<Option<Vec<T>>> {
    names
        .as_ref()
        .map(|n| n.iter().map(|s| parse(s)).collect())
        .transpose()
}

/// The suite and its matrix from `args` (flags over the suite file's `[sweep]`).
pub fn plan(args: &RunArgs) -> Result<Plan> {
    let suite = match &args.suite_file {
        Some(p) => SuiteFile::from_path(p)?,
        None => SuiteFile::builtin(&args.suite)?,
    };
    let sw = &suite.sweep;
    let models = match &args.model_dir {
        Some(dir) if args.models.is_empty() => vec![ModelSpec::from_dir(dir)?.name],
        Some(_) => {
            return Err(Error::Config(
                "--model-dir replaces --model: give one of them".into(),
            ))
        }
        None => pick(&args.models, sw.models.clone(), "gpt2-tiny".into()),
    };
    let file_dtypes = parse_all(&sw.dtypes, parse_dtype)?;
    let dtypes = pick(&args.dtypes, file_dtypes, DtypeArg::Auto);
    let (device, auto) = resolve_device(args.device, dtypes.contains(&DtypeArg::Auto));
    let auto_precision = auto.as_ref().map_or(Precision::Fp32, |a| a.precision);
    let precisions: Vec<Precision> = dtypes.iter().map(|d| d.resolve(auto_precision)).collect();
    let file_engines = parse_all(&sw.engines, parse_engine)?;
    let engines = pick(&args.engines, file_engines, EngineKind::Candle);
    let batch_sizes = pick(
        &args.batch_sizes,
        sw.batch_sizes.clone(),
        suite.run.batch_size,
    );
    let (seq_lens, new_tokens) = lengths(args, &suite)?;
    if batch_sizes.contains(&0) {
        return Err(Error::Config("--batch-size must be at least 1".into()));
    }
    if seq_lens.contains(&Some(0)) {
        return Err(Error::Config("--seq-len must be at least 1".into()));
    }
    let repeat = args.repeat.or(sw.repeat).unwrap_or(1);
    if repeat == 0 {
        return Err(Error::Config("--repeat must be at least 1".into()));
    }
    let (zeros, recomputes) = training_axes(args, &suite)?;
    let n = models.len()
        * precisions.len()
        * batch_sizes.len()
        * seq_lens.len()
        * new_tokens.len()
        * zeros.len()
        * recomputes.len()
        * engines.len();
    let sweep = n > 1
        || repeat > 1
        || args.isolate
        || args.resume
        || args.sweep_dir.is_some()
        || args.run_timeout.is_some();
    let engines = if sweep {
        one_engine_each(&engines)
    } else {
        engines
    };
    let configs = expand(&Axes {
        models,
        precisions,
        seq_lens,
        new_tokens,
        batch_sizes,
        zeros,
        recomputes,
        engines,
    });
    Ok(Plan {
        suite,
        device,
        auto: auto.map(|a| a.why),
        configs,
        repeat,
        sweep,
    })
}

/// The strategy axis (`--strategies` as ZeRO levels, else [None]: `--zero` decides) and the
/// recompute axis (`--recompute`'s values, else off).
fn training_axes(args: &RunArgs, suite: &SuiteFile) -> Result<(Vec<Option<u8>>, Vec<bool>)> {
    let mut recomputes: Vec<bool> = args
        .train
        .recompute
        .iter()
        .map(|&t| t == super::Toggle::On)
        .collect();
    recomputes.dedup();
    if recomputes.is_empty() {
        recomputes.push(false);
    }
    if args.strategies.is_empty() {
        return Ok((vec![None], recomputes));
    }
    if suite.train.is_none() {
        return Err(Error::Config(format!(
            "--strategies lays training strategies side by side: use it with --suite shakespeare or wikitext2, not {}",
            suite.name
        )));
    }
    if args.dp < 2 || args.zero != 0 {
        return Err(Error::Config(
            "--strategies runs each strategy over --dp N ranks: give --dp N (N >= 2) and no --zero"
                .into(),
        ));
    }
    let zeros = args.strategies.iter().map(|s| Some(s.zero())).collect();
    Ok((zeros, recomputes))
}

impl Plan {
    /// The plan of a sweep's child: its one configuration, run as a single run (or its ranks).
    pub fn only(self, config: RunConfig) -> Self {
        Self {
            configs: vec![config],
            repeat: 1,
            sweep: false,
            ..self
        }
    }
}

/// An optional length of each configuration (None: not set, the suite's default).
type Axis = Vec<Option<usize>>;

/// The sequence-length and new-token axes: for the generation suite the prompt lengths and
/// new tokens (`--prompt-lens`, `--new-tokens`, else the suite file's), elsewhere `--seq-len`
/// and no new tokens.
fn lengths(args: &RunArgs, suite: &SuiteFile) -> Result<(Axis, Axis)> {
    let sw = &suite.sweep;
    let some = |v: Vec<usize>| v.into_iter().map(Some).collect::<Vec<_>>();
    let Some(g) = &suite.generation else {
        if !args.prompt_lens.is_empty() || !args.new_tokens.is_empty() {
            return Err(Error::Config(format!(
                "--prompt-lens and --new-tokens are for --suite generation, not {}",
                suite.name
            )));
        }
        let seq = match (&args.seq_lens[..], &sw.seq_lens) {
            ([], Some(s)) => some(s.clone()),
            ([], None) => vec![None],
            (s, _) => some(s.to_vec()),
        };
        return Ok((seq, vec![None]));
    };
    if !args.seq_lens.is_empty() {
        return Err(Error::Config(
            "--seq-len is for LAMBADA: the generation suite takes --prompt-lens".into(),
        ));
    }
    let prompt = pick(&args.prompt_lens, sw.prompt_lens.clone(), g.prompt_len);
    let new = pick(&args.new_tokens, sw.new_tokens.clone(), g.new_tokens);
    if prompt.contains(&0) || new.contains(&0) {
        return Err(Error::Config(
            "--prompt-lens and --new-tokens must be at least 1 (0 new tokens generates nothing)"
                .into(),
        ));
    }
    Ok((some(prompt), some(new)))
}

/// In a sweep each engine is its own configuration: `both` is candle, then hf.
fn one_engine_each(engines: &[EngineKind]) -> Vec<EngineKind> {
    let mut out = vec![];
    for &kind in engines {
        for &k in crate::engines::registry::runs(kind) {
            if !out.contains(&k) {
                out.push(k);
            }
        }
    }
    out
}

/// `--data`: the embedded sample (none given), the suite's full file found locally (`full`),
/// or a path.
fn resolve_data(arg: Option<&str>, suite: &SuiteFile) -> Result<DataFile> {
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
fn weight_source(args: &RunArgs, checkpoint: Option<&PathBuf>) -> Result<WeightSource> {
    use super::WeightsKind;
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

/// Whether `args` or the suite file's `[sweep]` name one of `kinds`.
fn names_engine(args: &RunArgs, suite: &SuiteFile, kinds: &[EngineKind]) -> bool {
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
fn check_flags(args: &RunArgs, suite: &SuiteFile, weights: &WeightSource) -> Result<()> {
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

/// HF's attention and torch.compile as asked: `--hf-config`, else `--hf-attn` and `--hf-compile`.
fn hf_config(args: &RunArgs) -> (HfAttn, HfCompile) {
    args.hf_config.unwrap_or((args.hf_attn, args.hf_compile))
}

/// torch.compile asked for outright (`--hf-compile`, `--hf-config …+compile`), not left to
/// the probe.
fn compile_on(args: &RunArgs) -> bool {
    hf_config(args).1 == HfCompile::On
}

/// `--pad-multiple`: given, else 64 with `--hf-compile` (one compilation per bucket of 64
/// positions, in the warm-up) and 1 without. Training blocks all have one length.
fn pad_multiple(args: &RunArgs, suite: &SuiteFile) -> Result<usize> {
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
fn workload(args: &RunArgs, suite: &SuiteFile, config: &RunConfig) -> Result<Workload> {
    let generate = args.mode == super::Mode::Generate;
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
    if let Some(t) = &suite.train {
        let opts = resolve_train(args, suite, t, config)?;
        return Ok(Workload::Train(opts));
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
fn text_source(args: &RunArgs, suite: &SuiteFile, config: &RunConfig) -> Result<GenerateSource> {
    let (text, origin) = match args.data.as_deref() {
        None => (
            crate::scenarios::wikitext2::data::SAMPLE_EVAL.to_string(),
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

fn model_spec(args: &RunArgs, config: &RunConfig) -> Result<ModelSpec> {
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
    if let Workload::Train(opts) = &workload {
        // Before any weights load.
        let backward = opts
            .backward
            .unwrap_or(crate::train::Backward::default_for(&model));
        backward.check(&model)?;
        let candle = config.engine == EngineKind::Candle;
        if candle && opts.recompute && backward != crate::train::Backward::Manual {
            return Err(Error::Config(format!(
                "--recompute checkpoints the blocks of the manual step (GPT-2, --backward manual); {} trains with --backward {}",
                model.name,
                backward.as_str()
            )));
        }
    }
    let data = match &workload {
        // Training and text generation read their own data; this is a placeholder they ignore.
        Workload::Train(_)
        | Workload::Generate(GenerateOptions {
            source: GenerateSource::Text { .. },
            ..
        }) => DataFile::embedded_lambada_sample(),
        Workload::Score | Workload::Generate(_) => resolve_data(args.data.as_deref(), suite)?,
    };
    Ok(RunSpec {
        seed: args.seed,
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

/// `--engine llmc`: a training suite, a model, precision, device and weights llm.c's
/// default build runs, no per-phase times, and its binary (checked before anything runs).
fn check_llmc(
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

/// A single run of `args` (which must not be a sweep).
pub fn resolve(args: RunArgs, command_line: Vec<String>) -> Result<RunSpec> {
    let plan = plan(&args)?;
    match &plan.configs[..] {
        [config] if !plan.sweep => resolve_config(&args, &plan, config, None, command_line),
        _ => Err(Error::Config(
            "these options describe a sweep, not one run".into(),
        )),
    }
}

fn resolve_train(
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
    if engine == EngineKind::Llmc && config.recompute {
        return Err(Error::Config(
            "--recompute checkpoints candle's manual step or HF's blocks (llm.c's recompute is not wired in): use it with --engine candle or hf".into(),
        ));
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
fn hf_parallel(args: &RunArgs, config: &RunConfig, size: usize) -> Result<HfParallel> {
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
        return not_with(
            "for LAMBADA (it is for training suites: --suite wikitext2; for inference use --tp)",
        );
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
fn check_zero3(par: Parallel, spec: &RunSpec) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--strategies dp,zero1 --engine candle,hf`: HF has no ZeRO-1, so candle runs it alone.
    #[test]
    fn strategies_leave_out_zero1_for_hf() {
        let c = expand(&Axes {
            models: vec!["gpt2".into()],
            precisions: vec![Precision::Bf16],
            seq_lens: vec![None],
            new_tokens: vec![None],
            batch_sizes: vec![8],
            zeros: vec![Some(0), Some(1)],
            recomputes: vec![false, true],
            engines: vec![EngineKind::Candle, EngineKind::Hf],
        });
        let got: Vec<(Option<u8>, bool, &str)> = c
            .iter()
            .map(|c| (c.zero, c.recompute, c.engine.as_str()))
            .collect();
        let want = [
            (Some(0), false, "candle"),
            (Some(0), false, "hf"),
            (Some(0), true, "candle"),
            (Some(0), true, "hf"),
            (Some(1), false, "candle"),
            (Some(1), true, "candle"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn product_runs_engines_innermost() {
        let c = expand(&Axes {
            models: vec!["a".into(), "b".into()],
            precisions: vec![Precision::Fp32],
            seq_lens: vec![None],
            new_tokens: vec![None],
            batch_sizes: vec![1, 2],
            zeros: vec![None],
            recomputes: vec![false],
            engines: vec![EngineKind::Candle, EngineKind::Hf],
        });
        assert_eq!(c.len(), 8);
        assert_eq!(
            (c[0].engine.as_str(), c[1].engine.as_str()),
            ("candle", "hf")
        );
        assert_eq!((c[1].batch_size, c[2].batch_size), (1, 2));
        assert_eq!((c[3].model.as_str(), c[4].model.as_str()), ("a", "b"));
    }
}
