//! `bench` command line: parse options -> resolve a run -> run -> print the summary.

use crate::data::{search_dirs, DataFile};
use crate::device::{DeviceSpec, Precision};
use crate::engines::hf::{HfAttn, HfOptions};
use crate::engines::EngineKind;
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::record::SweepConfig;
use crate::runner::{run, side_by_side, summary_table, RunSpec};
use crate::suites::wikitext2::Splits;
use crate::suites::SuiteFile;
use crate::sweep::{expand, run_sweep, sweep_table, ChildTask, SweepOptions};
use crate::train_runner::{run_train, train_side_by_side, train_table, TrainOptions};
use crate::verify::verify;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

const ABOUT: &str =
    "Runs fixed transformer workloads the same way on every machine and logs samples/s, \
tokens/s, latency percentiles and peak memory as JSONL.";

const AFTER_HELP: &str = "\
Examples:
  # tiny random GPT-2 on the built-in 100-passage LAMBADA sample, CPU
  bench
  # GPT-2 124M shape, random weights, full LAMBADA on a GPU
  bench --model gpt2 --device cuda --dtype bf16 --data lambada_test.jsonl
  # an HF checkpoint dir (config.json + model.safetensors)
  bench --model-dir ./gpt2-hf --device cuda --data lambada_test.jsonl
  # compare with HF reference fixtures
  bench verify --model-dir tests/fixtures/gpt2-fixture
  # what this machine has: GPUs, driver, CUDA libraries, peer access, known problems
  bench env

Full LAMBADA: lambada_test.jsonl, 5153 passages, sha256 4aa8d02c...b226,
  https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl";

#[derive(Parser, Debug)]
#[command(name = "bench", version, about = ABOUT, after_help = AFTER_HELP, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compare this engine with HF transformers reference fixtures in a model dir
    /// (reference.safetensors logits, lambada_reference.json; made by scripts/make_fixtures.py).
    Verify(VerifyArgs),
    /// Environment report: host, GPUs (NVML), driver and CUDA, the CUDA libraries this binary
    /// loads (version, path), peer access, NCCL, and known problems with a fix each. Exits 1
    /// when something the built features need is missing.
    Env(EnvArgs),
    /// Check multi-process launch and rendezvous (no GPU needed): N ranks meet at rank 0 over
    /// TCP, receive the same id and the list of ranks, and stop with an error naming the rank
    /// if any one dies. Self-spawns --nproc ranks, or runs as one rank under torchrun (RANK,
    /// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), mpirun (OMPI_COMM_WORLD_*, plus
    /// MASTER_ADDR/PORT) or srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, plus
    /// MASTER_ADDR/PORT), e.g. across nodes.
    DistCheck(DistCheckArgs),
}

#[derive(Args, Debug)]
pub struct DistCheckArgs {
    /// Ranks to start on this host when no launcher variables are set.
    #[arg(long, default_value_t = 2)]
    pub nproc: usize,
    /// Seconds to wait for every rank to join.
    #[arg(long, default_value_t = 60)]
    pub rdzv_timeout: u64,
    /// Each rank then works (sleeps) this long before finishing, so a failure can be seen.
    #[arg(long, default_value_t = 0)]
    pub work_ms: u64,
}

#[derive(Args, Debug)]
pub struct EnvArgs {
    /// Print the report as JSON (the same object every run log's header holds as `host`).
    #[arg(long)]
    pub json: bool,
    /// CUDA builds: check the GPU trackers against known work (a 1 GiB tensor for memory, a
    /// matmul loop for energy vs mean power x time) on --device.
    #[arg(long, hide = true)]
    pub check_trackers: bool,
    /// Device of --check-trackers.
    #[arg(long, default_value = "cuda", hide = true)]
    pub device: DeviceSpec,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WeightsKind {
    /// HF's init (normal, std initializer_range) with --seed, made on the target device.
    Random,
    /// The safetensors in --model-dir.
    Checkpoint,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Workload to run.
    #[arg(long, default_value = "lambada", value_parser = ["lambada", "wikitext2"])]
    pub suite: String,

    /// Suite definition (TOML) replacing the built-in suites/NAME.toml.
    #[arg(long, value_name = "PATH")]
    pub suite_file: Option<PathBuf>,

    /// Model preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny, bloom-560m, bloom-1b1,
    /// bloom-1b7, bloom-3b, bloom-7b1, bloom (176B), bloom-tiny. A comma-separated list runs a
    /// sweep [default: gpt2-tiny].
    #[arg(
        long = "model",
        visible_alias = "models",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub models: Vec<String>,

    /// HF model directory (config.json + model.safetensors or a sharded index); replaces --model.
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,

    /// Where weights come from [default: checkpoint with --model-dir, else random].
    #[arg(long, value_enum)]
    pub weights: Option<WeightsKind>,

    /// Seed of random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,

    /// Precision: tf32 keeps fp32 weights and lets matmuls use TF32 tensor cores. A list runs a
    /// sweep [default: fp32].
    #[arg(
        long = "dtype",
        visible_alias = "dtypes",
        value_enum,
        value_delimiter = ','
    )]
    pub dtypes: Vec<Precision>,

    /// Passages per batch; a list runs a sweep [default: from the suite file, 16].
    #[arg(
        long = "batch-size",
        visible_alias = "batch-sizes",
        value_delimiter = ',',
        value_name = "N"
    )]
    pub batch_sizes: Vec<usize>,

    /// Left-truncate each LAMBADA context to N tokens (lm-eval's max_length); a list runs a
    /// sweep [default: the model's maximum].
    #[arg(
        long = "seq-len",
        visible_alias = "seq-lens",
        value_delimiter = ',',
        value_name = "N"
    )]
    pub seq_lens: Vec<usize>,

    /// Run each configuration N times, each in its own process; the sweep log folds them into
    /// median, min, max and CV [default: from the suite file, 1].
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,

    /// Continue a sweep: run only the configurations without an `ok` or `oom` record in its
    /// sweep log (--sweep-dir, else the newest sweep_* in --log-dir).
    #[arg(long)]
    pub resume: bool,

    /// The sweep's directory (sweep.jsonl + run logs) [default: LOG_DIR/sweep_TIME].
    #[arg(long, value_name = "DIR")]
    pub sweep_dir: Option<PathBuf>,

    /// Run even a single configuration in a child process, recorded like a sweep.
    #[arg(long)]
    pub isolate: bool,

    /// In a sweep, kill a run that takes longer than SECS (recorded as `timeout`, the sweep
    /// goes on).
    #[arg(long, value_name = "SECS")]
    pub run_timeout: Option<f64>,

    /// Score only the first N passages.
    #[arg(long)]
    pub limit: Option<usize>,

    /// Untimed warm-up batches before timing [default: from the suite file, 2].
    #[arg(long)]
    pub warmup: Option<usize>,

    /// Data file (JSONL, {"text": …} a line) [default: the built-in 100-passage sample].
    /// `--data full` looks for the suite's full file in $BENCH_DATA_DIR, ./data and
    /// ~/.cache/transformer-bench.
    #[arg(long, value_name = "PATH")]
    pub data: Option<String>,

    /// Directory of the JSONL run logs.
    #[arg(long, default_value = "results/logs", value_name = "DIR")]
    pub log_dir: PathBuf,

    /// candle (this crate's models), hf (transformers + PyTorch in a Python worker), or both:
    /// the same data, batches and weights through each, then a side-by-side summary. A list
    /// runs a sweep (`both` in it means candle and hf) [default: candle].
    #[arg(
        long = "engine",
        visible_alias = "engines",
        value_enum,
        value_delimiter = ','
    )]
    pub engines: Vec<EngineKind>,

    /// Python with torch + transformers for the HF engine [default: $BENCH_PYTHON, else python3].
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,

    /// HF engine attention: auto = sdpa where the model supports it (not BLOOM in
    /// transformers 5.x), else eager.
    #[arg(long, value_enum, default_value_t = HfAttn::Auto)]
    pub hf_attn: HfAttn,

    /// HF engine: torch.compile the model (dynamic shapes; compile time falls in the warm-up).
    #[arg(long)]
    pub hf_compile: bool,

    /// candle engine on CUDA: the fused paths to use (comma list). all; none (candle's own
    /// ops, for comparison); lt (inference projections as one cuBLASLt matmul with bias and
    /// GELU in its epilogue); softmax (attention scale + mask + softmax + dropout in one
    /// kernel, and its backward); bias-act (bias + activation in one kernel, and its
    /// backward); adamw (AdamW in two kernels per tensor, the gradient norm in one, the clip
    /// folded in); layer-norm (training LayerNorm as one kernel, and its backward); dropout
    /// (masks hashed inside the kernels instead of stored); cross-entropy (the training loss
    /// in one kernel each way, GPT-2's lm head padded to 64 columns). docs/perf-notes.md has
    /// the effect of each. No effect on CPU.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub fused: Vec<crate::kernels::Fused>,

    /// HF engine: run this worker script instead of the built-in one (development, tests).
    #[arg(long, value_name = "PATH", hide = true)]
    pub hf_worker: Option<PathBuf>,

    /// Write the random weights as an HF checkpoint (config.json + model.safetensors in
    /// --dtype) to DIR, loadable by --model-dir and by transformers.
    #[arg(long, value_name = "DIR")]
    pub save_weights: Option<PathBuf>,

    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,

    /// Tensor parallelism over N ranks, one process per GPU (Megatron-style: attention heads
    /// and MLP units split, one all-reduce per residual branch; NCCL on GPUs, which needs a
    /// build with the `nccl` feature, TCP on CPUs). Without launcher variables this command
    /// starts the N ranks itself on cuda:0..N-1 (CUDA_VISIBLE_DEVICES picks them); under
    /// torchrun, mpirun or srun (see `bench dist-check --help`) each process is one rank,
    /// across nodes too. Rank 0 writes the log, its header lists every rank's GPU. LAMBADA
    /// and the candle engine only.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub tp: usize,

    /// Data-parallel fine-tuning over N ranks, one process per GPU (--suite wikitext2, candle
    /// engine): each rank trains on its share of every optimizer step's micro-batches (global
    /// batch = N x --batch-size x --grad-accum blocks, --lr unchanged) and the gradients are
    /// averaged over NCCL (TCP on CPUs) in 128 MiB buckets after the backward (candle's
    /// backward has no per-gradient hook to overlap them with). Launched like --tp; cannot be
    /// combined with --tp. Rank 0 logs, with every rank's peak memory and the share of time
    /// in all-reduces.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub dp: usize,

    /// With --dp: 1 splits the AdamW state over the ranks (ZeRO stage 1): each rank updates the
    /// parameters it owns, then shares them; 0 keeps a whole copy on every rank.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub zero: u8,

    /// With --tp or --dp: seconds to wait for every rank to join (model loading comes after).
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    pub rdzv_timeout: u64,

    #[command(flatten)]
    pub train: TrainArgs,
}

/// Training suites (`--suite wikitext2`): HF Trainer / run_clm defaults unless given.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Training (--suite wikitext2)")]
pub struct TrainArgs {
    /// Evaluation text file when --data is a training file (not a directory).
    #[arg(long, value_name = "PATH")]
    pub eval_data: Option<PathBuf>,
    /// Tokens per block [default: min(1024, n_positions), as run_clm].
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Training epochs [default: from the suite file, 3].
    #[arg(long)]
    pub epochs: Option<f64>,
    /// Optimizer steps; overrides --epochs (HF max_steps).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Micro-batches per optimizer step [default: 1].
    #[arg(long)]
    pub grad_accum: Option<usize>,
    /// Peak learning rate [default: 5e-5].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Linear learning-rate warm-up, optimizer steps (HF warmup_steps) [default: 0].
    #[arg(long)]
    pub lr_warmup_steps: Option<usize>,
    /// Dropout off (for comparisons); default: the config's dropout.
    #[arg(long)]
    pub no_dropout: bool,
    /// Time forward, backward and optimizer update of each step (synchronizes the device
    /// between them, which costs a little throughput); logged per step, medians in the summary.
    #[arg(long)]
    pub phase_times: bool,
    /// Write the trained weights (fp32) as an HF checkpoint (config.json + model.safetensors).
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,
}

impl TrainArgs {
    /// The first training flag given, for the error when the suite does not train.
    fn given(&self) -> Option<&'static str> {
        [
            (self.eval_data.is_some(), "--eval-data"),
            (self.block_size.is_some(), "--block-size"),
            (self.epochs.is_some(), "--epochs"),
            (self.max_steps.is_some(), "--max-steps"),
            (self.grad_accum.is_some(), "--grad-accum"),
            (self.lr.is_some(), "--lr"),
            (self.lr_warmup_steps.is_some(), "--lr-warmup-steps"),
            (self.no_dropout, "--no-dropout"),
            (self.phase_times, "--phase-times"),
            (self.save.is_some(), "--save"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Model dir holding the fixtures next to config.json + model.safetensors.
    #[arg(long, value_name = "DIR")]
    pub model_dir: PathBuf,
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    pub dtype: Precision,
    /// Batch size for the LAMBADA passages (results must not depend on it).
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Exit non-zero if logits or log-likelihoods differ by more than this (relative).
    #[arg(long)]
    pub tolerance: Option<f64>,
}

fn resolve_data(arg: Option<&str>, suite: &SuiteFile) -> Result<DataFile> {
    match arg {
        None => Ok(DataFile::embedded_lambada_sample()),
        Some("full") => {
            let found = search_dirs()
                .into_iter()
                .map(|d| d.join(&suite.data.file))
                .find(|p| p.is_file());
            match found {
                Some(p) => DataFile::read(&p, &suite.data_hint()),
                None => Err(Error::NotFound {
                    what: suite.data.file.clone(),
                    path: PathBuf::from("$BENCH_DATA_DIR, ./data, ~/.cache/transformer-bench"),
                    hint: suite.data_hint(),
                }),
            }
        }
        Some(path) => DataFile::read(&PathBuf::from(path), &suite.data_hint()),
    }
}

/// What a `bench` invocation runs: its suite, the configurations of its matrix, and whether
/// they run as a sweep of child processes.
pub struct Plan {
    pub suite: SuiteFile,
    pub configs: Vec<SweepConfig>,
    pub repeat: usize,
    pub sweep: bool,
}

fn engine_name(e: EngineKind) -> String {
    e.to_possible_value()
        .expect("no skipped variants")
        .get_name()
        .to_string()
}

/// Each list comes from its flag, else the suite file's `[sweep]`, else the default.
pub fn plan(args: &RunArgs) -> Result<Plan> {
    let suite = match &args.suite_file {
        Some(p) => SuiteFile::from_path(p)?,
        None => SuiteFile::builtin(&args.suite)?,
    };
    let sw = &suite.sweep;
    let pick = |flag: Vec<String>, file: &Option<Vec<String>>, default: &str| {
        if !flag.is_empty() {
            flag
        } else {
            file.clone().unwrap_or_else(|| vec![default.to_string()])
        }
    };
    let models = match &args.model_dir {
        Some(dir) if args.models.is_empty() => vec![ModelSpec::from_dir(dir)?.name],
        Some(_) => {
            return Err(Error::Config(
                "--model-dir replaces --model: give one of them".into(),
            ))
        }
        None => pick(args.models.clone(), &sw.models, "gpt2-tiny"),
    };
    let dtypes = pick(
        args.dtypes.iter().map(|d| d.to_string()).collect(),
        &sw.dtypes,
        "fp32",
    );
    let engines = pick(
        args.engines.iter().map(|e| engine_name(*e)).collect(),
        &sw.engines,
        "candle",
    );
    let batch_sizes = match (&args.batch_sizes[..], &sw.batch_sizes) {
        ([], Some(b)) => b.clone(),
        ([], None) => vec![suite.run.batch_size],
        (b, _) => b.to_vec(),
    };
    let seq_lens: Vec<Option<usize>> = match (&args.seq_lens[..], &sw.seq_lens) {
        ([], Some(s)) => s.iter().map(|n| Some(*n)).collect(),
        ([], None) => vec![None],
        (s, _) => s.iter().map(|n| Some(*n)).collect(),
    };
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
    let n = models.len() * dtypes.len() * batch_sizes.len() * seq_lens.len() * engines.len();
    let sweep = n > 1
        || repeat > 1
        || args.isolate
        || args.resume
        || args.sweep_dir.is_some()
        || args.run_timeout.is_some();
    // In a sweep each engine is its own configuration: `both` is candle, then hf.
    let engines = if sweep {
        let mut e: Vec<String> = vec![];
        for name in engines {
            let names = if name == "both" {
                vec!["candle".to_string(), "hf".to_string()]
            } else {
                vec![name]
            };
            for n in names {
                if !e.contains(&n) {
                    e.push(n);
                }
            }
        }
        e
    } else {
        engines
    };
    let configs = expand(&models, &dtypes, &seq_lens, &batch_sizes, &engines);
    Ok(Plan {
        suite,
        configs,
        repeat,
        sweep,
    })
}

/// The run of one configuration of `args`' plan.
pub fn resolve_config(
    args: &RunArgs,
    suite: &SuiteFile,
    config: &SweepConfig,
    repeat: Option<usize>,
    command_line: Vec<String>,
) -> Result<RunSpec> {
    let model = match &args.model_dir {
        Some(dir) => ModelSpec::from_dir(dir)?,
        None => ModelSpec::preset(&config.model)?,
    };
    let precision = <Precision as ValueEnum>::from_str(&config.dtype, true).map_err(|_| {
        Error::Config(format!(
            "unknown dtype '{}' (fp32, tf32, fp16, bf16)",
            config.dtype
        ))
    })?;
    let engine = <EngineKind as ValueEnum>::from_str(&config.engine, true).map_err(|_| {
        Error::Config(format!(
            "unknown engine '{}' (candle, hf, both)",
            config.engine
        ))
    })?;
    let weights = match (args.weights, &args.model_dir) {
        (Some(WeightsKind::Random), _) | (None, None) => WeightSource::Random { seed: args.seed },
        (_, Some(dir)) => WeightSource::Dir(dir.clone()),
        (Some(WeightsKind::Checkpoint), None) => {
            return Err(Error::Config(
                "--weights checkpoint needs --model-dir DIR".into(),
            ))
        }
    };
    let uses_hf = args.engines.iter().any(|e| *e != EngineKind::Candle)
        || suite
            .sweep
            .engines
            .as_ref()
            .is_some_and(|e| e.iter().any(|e| e != "candle"));
    if !uses_hf && (args.hf_compile || args.hf_attn != HfAttn::Auto || args.python.is_some()) {
        return Err(Error::Config(
            "--python, --hf-attn and --hf-compile are for --engine hf or both".into(),
        ));
    }
    if args.save_weights.is_some() && !matches!(weights, WeightSource::Random { .. }) {
        return Err(Error::Config(
            "--save-weights writes random weights: use it with --weights random".into(),
        ));
    }
    if args.limit == Some(0) {
        return Err(Error::Config("--limit must be at least 1".into()));
    }
    let train = match &suite.train {
        Some(t) => Some(resolve_train(args, t, config.batch_size, engine)?),
        None => {
            if let Some(flag) = args.train.given() {
                return Err(Error::Config(format!(
                    "{flag} is a training option: it applies to --suite wikitext2, not {}",
                    suite.name
                )));
            }
            None
        }
    };
    let data = match train {
        // Training suites read their own splits; this is a placeholder the LAMBADA path ignores.
        Some(_) => DataFile::embedded_lambada_sample(),
        None => resolve_data(args.data.as_deref(), suite)?,
    };
    Ok(RunSpec {
        seed: args.seed,
        train,
        warmup_batches: args.warmup.unwrap_or(suite.run.warmup_batches),
        suite: suite.clone(),
        model,
        weights,
        tokenizer_dir: args.model_dir.clone(),
        device: args.device,
        precision,
        batch_size: config.batch_size,
        limit: args.limit,
        seq_len: config.seq_len,
        repeat,
        data,
        log_dir: args.log_dir.clone(),
        save_weights: args.save_weights.clone(),
        engine,
        hf: HfOptions {
            python: args.python.clone(),
            attn: args.hf_attn,
            compile: args.hf_compile,
            worker: args.hf_worker.clone(),
        },
        command_line,
        progress: !args.no_progress,
        tp: None,
        dp: None,
    })
}

/// A single run of `args` (which must not be a sweep).
pub fn resolve(args: RunArgs, command_line: Vec<String>) -> Result<RunSpec> {
    let plan = plan(&args)?;
    match &plan.configs[..] {
        [config] if !plan.sweep => resolve_config(&args, &plan.suite, config, None, command_line),
        _ => Err(Error::Config(
            "these options describe a sweep, not one run".into(),
        )),
    }
}

/// Runs a sweep: checks every configuration resolves (a typo fails before any child starts),
/// then hands them to [`run_sweep`].
fn sweep(args: RunArgs, plan: Plan, command_line: Vec<String>) -> Result<ExitCode> {
    if args.save_weights.is_some() {
        return Err(Error::Config(
            "--save-weights writes one model: run it without a sweep".into(),
        ));
    }
    for config in &plan.configs {
        ModelSpec::preset(&config.model).or_else(|e| match &args.model_dir {
            Some(dir) => ModelSpec::from_dir(dir),
            None => Err(e),
        })?;
    }
    resolve_config(&args, &plan.suite, &plan.configs[0], None, vec![])?;
    let outcome = run_sweep(SweepOptions {
        suite: plan.suite.name.clone(),
        device: args.device.to_string(),
        configs: plan.configs,
        repeat: plan.repeat,
        log_dir: args.log_dir.clone(),
        sweep_dir: args.sweep_dir.clone(),
        resume: args.resume,
        run_timeout: args
            .run_timeout
            .map(|s| std::time::Duration::from_secs_f64(s.max(0.))),
        progress: !args.no_progress,
        child_args: command_line.iter().skip(1).cloned().collect(),
        command_line,
    })?;
    print!("{}", sweep_table(&outcome));
    Ok(if outcome.succeeded() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One configuration, in this process: a plain run, a sweep's child ([`ChildTask`]) or one
/// rank of a parallel run (only rank 0 prints).
fn single(spec: RunSpec) -> Result<ExitCode> {
    if !spec.is_logging_rank() {
        match &spec.train {
            Some(opts) => drop(run_train(&spec, opts)?),
            None => drop(run(spec)?),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(opts) = &spec.train {
        let outcomes = run_train(&spec, opts)?;
        for out in &outcomes {
            print!("{}", train_table(&out.header, &out.summary, &out.log_path));
        }
        if let [candle, hf] = outcomes.as_slice() {
            let (table, agree) = train_side_by_side(candle, hf);
            print!("{table}");
            if !agree {
                return Ok(ExitCode::from(1));
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let outcomes = run(spec)?;
    for out in &outcomes {
        print!(
            "{}",
            summary_table(&out.header, &out.summary, &out.log_path)
        );
    }
    Ok(match outcomes.as_slice() {
        [candle, hf] => {
            let (table, agree) = side_by_side(candle, hf);
            print!("{table}");
            if agree {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        _ => ExitCode::SUCCESS,
    })
}

fn run_command(args: RunArgs, command_line: Vec<String>) -> Result<ExitCode> {
    crate::kernels::set_enabled(&args.fused);
    let plan = plan(&args)?;
    if args.tp != 1 || args.dp != 1 {
        return parallel(args, plan, command_line);
    }
    if args.zero != 0 {
        return Err(Error::Config("--zero is for --dp runs".into()));
    }
    if let Some(task) = ChildTask::from_env()? {
        let mut spec = resolve_config(
            &args,
            &plan.suite,
            &task.config,
            Some(task.repeat),
            command_line,
        )?;
        spec.log_dir = task.log_dir;
        spec.progress = false;
        return single(spec);
    }
    if plan.sweep {
        return sweep(args, plan, command_line);
    }
    let spec = resolve_config(&args, &plan.suite, &plan.configs[0], None, command_line)?;
    single(spec)
}

/// `--tp N` or `--dp N`: as one rank (launcher variables set), join the group and run; else
/// start the N ranks of this same command and wait for them.
fn parallel(args: RunArgs, plan: Plan, command_line: Vec<String>) -> Result<ExitCode> {
    use crate::dist::{group::GroupRank, spawn::spawn_ranks, World};
    let (n, flag) = match (args.tp, args.dp) {
        (tp, 1) => (tp, "--tp"),
        (1, dp) => (dp, "--dp"),
        _ => {
            return Err(Error::Config(
                "--tp and --dp cannot be combined yet: use one of them".into(),
            ))
        }
    };
    let not_with = |what: &str| Err(Error::Config(format!("{flag} is not supported {what}")));
    if plan.sweep {
        return not_with(
            "in a sweep (one configuration at a time; --repeat and --isolate included)",
        );
    }
    if plan.configs[0].engine != "candle" {
        return not_with("with --engine hf or both (the candle engine only)");
    }
    if args.save_weights.is_some() {
        return not_with("with --save-weights (write the weights with a single-process run)");
    }
    let training = plan.suite.train.is_some();
    if flag == "--tp" && training {
        return not_with("for training suites (LAMBADA only; data parallelism is --dp)");
    }
    if flag == "--dp" && !training {
        return not_with(
            "for LAMBADA (it is for training suites: --suite wikitext2; for inference use --tp)",
        );
    }
    if args.zero != 0 && flag != "--dp" {
        return Err(Error::Config("--zero is for --dp runs".into()));
    }
    let spec = resolve_config(&args, &plan.suite, &plan.configs[0], None, command_line)?;
    if n == 0 {
        return Err(Error::Config(format!("{flag} must be at least 1")));
    }
    if flag == "--tp" {
        spec.model.check_tp(n)?;
    }
    if let DeviceSpec::Cuda(n @ 1..) = args.device {
        return Err(Error::Config(format!(
            "--device cuda:{n} with {flag}: each rank uses cuda:LOCAL_RANK; pick GPUs with CUDA_VISIBLE_DEVICES and pass --device cuda"
        )));
    }
    if matches!(args.device, DeviceSpec::Cuda(_)) && !cfg!(feature = "nccl") {
        return Err(Error::Unsupported(crate::dist::group::NO_NCCL.into()));
    }
    let Some(world) = World::from_env()? else {
        let child_args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        spawn_ranks(n, &child_args)?;
        return Ok(ExitCode::SUCCESS);
    };
    if world.size != n {
        return Err(Error::Config(format!(
            "{flag} {n}, but the launcher started {} ranks: start exactly {n} (one per GPU)",
            world.size
        )));
    }
    let timeout = std::time::Duration::from_secs(args.rdzv_timeout);
    let rank = GroupRank::join(world, args.device, timeout)?;
    let spec = match flag {
        "--tp" => RunSpec {
            tp: Some(rank.ctx.clone()),
            ..spec
        },
        _ => RunSpec {
            dp: Some(crate::runner::DpRun {
                ctx: rank.ctx.clone(),
                zero1: args.zero == 1,
            }),
            ..spec
        },
    };
    let code = single(spec)?;
    rank.finish(timeout)?;
    Ok(code)
}

fn resolve_train(
    args: &RunArgs,
    t: &crate::suites::SuiteTrain,
    batch_size: usize,
    engine: EngineKind,
) -> Result<TrainOptions> {
    let a = &args.train;
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
    let splits = match args.data.as_deref() {
        None => Splits::sample(),
        Some(p) => Splits::from_path(std::path::Path::new(p), a.eval_data.as_deref())?,
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
        phase_times: a.phase_times,
        save: a.save.clone(),
    })
}

fn run_verify(args: VerifyArgs) -> Result<bool> {
    let report = verify(&args.model_dir, args.device, args.dtype, args.batch_size)?;
    println!(
        "verify {} on {} in {}",
        args.model_dir.display(),
        args.device,
        args.dtype
    );
    let mut ok = true;
    let tol = args.tolerance;
    if let Some(l) = &report.logits {
        println!(
            "  logits: {} positions, max |Δ| {:.3e}, max |ref| {:.3}, max rel err {:.3e}",
            l.n_positions, l.max_abs_err, l.max_abs_ref, l.max_rel_err
        );
        ok &= tol.is_none_or(|t| l.max_rel_err <= t);
    }
    if let Some(c) = &report.lambada {
        println!(
            "  lambada: {} passages, tokens equal {}/{}, ll max |Δ| {:.3e} (rel {:.3e}), greedy equal {}/{} (ours {}, ref {})",
            c.n_passages,
            c.tokens_equal,
            c.n_passages,
            c.ll_max_abs_err,
            c.ll_max_rel_err,
            c.greedy_equal,
            c.n_passages,
            c.greedy_ours,
            c.greedy_ref
        );
        ok &= c.tokens_equal == c.n_passages && tol.is_none_or(|t| c.ll_max_rel_err <= t);
    }
    println!(
        "  json: {}",
        serde_json::to_string(&report).expect("report serializes")
    );
    Ok(ok)
}

fn run_env(args: EnvArgs) -> Result<bool> {
    if args.check_trackers {
        print!("{}", crate::trackers::check_trackers(args.device)?);
        return Ok(true);
    }
    let report = EnvReport::collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        print!("{}", report.to_text());
    }
    Ok(!report.has_errors())
}

/// `bench dist-check`: as a rank (launcher variables set), meet the others and report; else
/// start `--nproc` ranks of this same command.
fn run_dist_check(a: DistCheckArgs) -> Result<()> {
    use crate::dist::{spawn::spawn_ranks, Peer, Rendezvous, World};
    use std::time::Duration;
    let Some(world) = World::from_env()? else {
        if a.nproc == 0 {
            return Err(Error::Config("--nproc must be at least 1".into()));
        }
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        spawn_ranks(a.nproc, &args)?;
        println!(
            "dist-check: {} ranks met, agreed on the id and finished",
            a.nproc
        );
        return Ok(());
    };
    let me = Peer {
        rank: world.rank,
        host: gethostname::gethostname().to_string_lossy().into_owned(),
        pid: std::process::id(),
        info: serde_json::json!({ "local_rank": world.local_rank }),
    };
    let timeout = Duration::from_secs(a.rdzv_timeout);
    // The id rank 0 hands out: random bytes here (NCCL's unique id in a parallel run).
    let make_id = || Ok((0..128).map(|_| rand::random::<u8>()).collect());
    let rdzv = Rendezvous::join(&world, me, make_id, timeout)?;
    let digest = crate::data::sha256_hex(&rdzv.id);
    println!(
        "rank {}/{} ({:?}): id sha256 {} from rank 0, ranks {:?}",
        world.rank,
        world.size,
        world.launcher,
        &digest[..16],
        rdzv.peers.iter().map(|p| p.rank).collect::<Vec<_>>()
    );
    // Test hook: this rank dies right after the rendezvous, as a crashed rank would.
    if std::env::var("BENCH_DIST_CHECK_DIE").ok() == Some(world.rank.to_string()) {
        std::process::exit(3);
    }
    std::thread::sleep(Duration::from_millis(a.work_ms));
    rdzv.finish(timeout)
}

/// Entry point of the `bench` binary.
pub fn main() -> ExitCode {
    let command_line: Vec<String> = std::env::args().collect();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Verify(v)) => run_verify(v).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Some(Command::Env(e)) => run_env(e).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Some(Command::DistCheck(d)) => run_dist_check(d).map(|()| ExitCode::SUCCESS),
        None => run_command(cli.run, command_line),
    };
    result.unwrap_or_else(|e| {
        eprintln!("Error: {e}");
        ExitCode::from(2)
    })
}
