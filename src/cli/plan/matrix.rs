//! The plan's matrix: the axes the flags and the suite file give (model × dtype × seq-len ×
//! batch size × engine, training's ZeRO stages and recompute) and their product as
//! [`RunConfig`]s.

use crate::cli::{DtypeArg, RunArgs};
use crate::device::DeviceSpec;
use crate::device::Precision;
use crate::engines::EngineKind;
use crate::error::{Error, Result};
use crate::record::SweepConfig;
use crate::scenarios::suite_file::SuiteFile;
use crate::train::Recompute;
use clap::ValueEnum;

pub(super) fn parse_precision(s: &str) -> Result<Precision> {
    <Precision as ValueEnum>::from_str(s, true)
        .map_err(|_| Error::Config(format!("unknown dtype '{s}' (fp32, tf32, fp16, bf16)")))
}

pub(super) fn parse_dtype(s: &str) -> Result<DtypeArg> {
    <DtypeArg as ValueEnum>::from_str(s, true).map_err(|_| {
        Error::Config(format!(
            "unknown dtype '{s}' (auto, fp32, tf32, fp16, bf16)"
        ))
    })
}

pub(super) fn parse_engine(s: &str) -> Result<EngineKind> {
    <EngineKind as ValueEnum>::from_str(s, true)
        .map_err(|_| Error::Config(format!("unknown engine '{s}' (candle, hf, both, llmc)")))
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
    pub recomputes: Vec<Recompute>,
    /// The serving suite's `--request-rate` list ([None] for the other suites).
    pub request_rates: Vec<Option<f64>>,
    pub engines: Vec<EngineKind>,
}

/// The configurations in run order: models, then dtypes, sequence (prompt) lengths, new
/// tokens, batch sizes, request rates (in the order given), strategies, recompute and engines
/// (innermost, so engines of one configuration run back to back).
pub fn expand(a: &Axes) -> Vec<RunConfig> {
    let mut out = vec![];
    for model in &a.models {
        for &precision in &a.precisions {
            for &seq_len in &a.seq_lens {
                for &new_tokens in &a.new_tokens {
                    for &batch_size in &a.batch_sizes {
                        for &request_rate in &a.request_rates {
                            let base = RunConfig {
                                model: model.clone(),
                                precision,
                                batch_size,
                                seq_len,
                                engine: EngineKind::Candle,
                                new_tokens,
                                zero: None,
                                recompute: Recompute::Off,
                                request_rate,
                            };
                            out.extend(training_configs(a, base));
                        }
                    }
                }
            }
        }
    }
    out
}

/// [`expand`], refusing a product that HF's gaps leave empty.
pub fn expand_some(a: &Axes) -> Result<Vec<RunConfig>> {
    let configs = expand(a);
    if !configs.is_empty() {
        return Ok(configs);
    }
    // `training_configs` leaves out what HF cannot run, and nothing else is left.
    Err(Error::Config(match a.recomputes.contains(&Recompute::Mlp) {
        true => "HF's gradient checkpointing recomputes whole blocks: --recompute mlp is the candle engine's; use --recompute on with --engine hf".into(),
        false => "HF has no ZeRO-1 (FSDP shards the gradients with the state): use --strategies dp,zero2,zero3 with --engine hf".into(),
    }))
}

/// `base` at each strategy, recompute setting and engine of `a`.
pub(super) fn training_configs(a: &Axes, base: RunConfig) -> Vec<RunConfig> {
    let mut out = vec![];
    for &zero in &a.zeros {
        for &recompute in &a.recomputes {
            // HF has no ZeRO-1 (FSDP shards gradients with the state) and checkpoints whole
            // blocks only: candle runs those alone.
            let hf_lacks = zero == Some(1) || recompute == Recompute::Mlp;
            let engines = a
                .engines
                .iter()
                .filter(|&&e| !(e == EngineKind::Hf && hf_lacks));
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
pub(super) fn pick<T: Clone>(flag: &[T], file: Option<Vec<T>>, default: T) -> Vec<T> {
    match (flag, file) {
        ([], Some(f)) => f,
        ([], None) => vec![default],
        (f, _) => f.to_vec(),
    }
}

/// A suite file's list of names, parsed (the first bad name is the error).
pub(super) fn parse_all<T>(
    names: &Option<Vec<String>>,
    parse: fn(&str) -> Result<T>,
) -> Result<Option<Vec<T>>> {
    names
        .as_ref()
        .map(|n| n.iter().map(|s| parse(s)).collect())
        .transpose()
}

/// The strategy axis (`--strategies` as ZeRO levels, else [None]: `--zero` decides) and the
/// recompute axis (`--recompute`'s values, else off).
pub(super) fn training_axes(
    args: &RunArgs,
    suite: &SuiteFile,
) -> Result<(Vec<Option<u8>>, Vec<Recompute>)> {
    // Each kind once, in the order given (a repeated kind would repeat a sweep key). Outside
    // the training suites no axis: the flag itself is refused as a training option.
    let mut recomputes: Vec<Recompute> = vec![];
    for &r in args
        .train
        .recompute
        .iter()
        .filter(|_| suite.train.is_some())
    {
        if !recomputes.contains(&r) {
            recomputes.push(r);
        }
    }
    if recomputes.is_empty() {
        recomputes.push(Recompute::Off);
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

/// The sequence-length and new-token axes: for the generation suite the prompt lengths and
/// new tokens (`--prompt-lens`, `--new-tokens`, else the suite file's), elsewhere `--seq-len`
/// and no new tokens.
pub(super) fn lengths(args: &RunArgs, suite: &SuiteFile) -> Result<(Axis, Axis)> {
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
pub(super) fn one_engine_each(engines: &[EngineKind]) -> Vec<EngineKind> {
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
    pub recompute: Recompute,
    /// The serving suite: requests/s (infinite: all at 0); None for the other suites.
    pub request_rate: Option<f64>,
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
            recompute: (self.recompute != Recompute::Off).then_some(self.recompute),
            request_rate: self.request_rate.map(super::serve::show_rate),
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
            recompute: c.recompute.unwrap_or_default(),
            request_rate: c
                .request_rate
                .as_deref()
                .map(|r| {
                    r.parse::<f64>().map_err(|_| {
                        Error::Config(format!("bad request rate '{r}' in a sweep task"))
                    })
                })
                .transpose()?,
        })
    }
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

impl Plan {
    /// The plan a sweep's child will run for `config` (see [`Plan::only`]), made beside this one
    /// so that the sweep can check it before any child starts.
    pub fn one_of(&self, config: &RunConfig) -> Self {
        Self {
            suite: self.suite.clone(),
            device: self.device,
            auto: self.auto.clone(),
            configs: vec![config.clone()],
            repeat: 1,
            sweep: false,
        }
    }

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
