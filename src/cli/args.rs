//! The `bench` command line as clap reads it: [`Cli`], its subcommands and every flag of a
//! run ([`RunArgs`], [`TrainArgs`]). What the flags mean together is [`super::plan`]'s.

use crate::device::{DeviceSpec, Precision};
use crate::engines::hf::{HfAttn, HfCompile};
use crate::engines::EngineKind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

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
    /// (reference.safetensors logits, lambada_reference.json; made by scripts/hf_fixtures/make_fixtures.py).
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

/// `--device`: a device, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceArg {
    Auto,
    Spec(DeviceSpec),
}

impl std::str::FromStr for DeviceArg {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(DeviceArg::Auto),
            _ => s
                .parse()
                .map(DeviceArg::Spec)
                .map_err(|e: String| e.replace("use cpu, cuda", "use auto, cpu, cuda")),
        }
    }
}

/// `--dtype`: a precision, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// bf16 on a GPU that has it (compute capability 8.0+), else fp32.
    Auto,
    Fp32,
    Tf32,
    Fp16,
    Bf16,
    /// candle engine, inference: the projections' and LM head's weights as E4M3 with a scale
    /// per output row, activations bf16 (the decode GEMV reads the fp8 bytes on CUDA).
    Fp8,
}

impl DtypeArg {
    /// The precision, `auto` resolved to `auto_precision`.
    pub fn resolve(self, auto_precision: Precision) -> Precision {
        match self {
            DtypeArg::Auto => auto_precision,
            DtypeArg::Fp32 => Precision::Fp32,
            DtypeArg::Tf32 => Precision::Tf32,
            DtypeArg::Fp16 => Precision::Fp16,
            DtypeArg::Bf16 => Precision::Bf16,
            DtypeArg::Fp8 => Precision::Fp8,
        }
    }
}

/// `--mode`: what the LAMBADA suite measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One forward pass a batch; log-likelihoods, accuracy and perplexity as lm-eval.
    Score,
    /// Greedy generation with a KV cache; accuracy as FasterTransformer's bloom_lambada.
    Generate,
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
    /// Workload to run: lambada (scoring, or generation with --mode generate), wikitext2
    /// (fine-tuning), generation (prompts from a text, time to first token and inter-token
    /// latency), shakespeare (Tiny Shakespeare as llm.c splits it, training from random
    /// weights or a checkpoint: time per epoch, train/val loss, peak memory, MFU), serving
    /// (requests arriving over time, batched as they arrive: TTFT, TPOT, goodput; candle).
    #[arg(long, default_value = "lambada", value_parser = ["lambada", "wikitext2", "generation", "shakespeare", "serving"])]
    pub suite: String,

    /// LAMBADA: score (lm-eval: the last word's log-likelihood from one forward pass) or
    /// generate (FasterTransformer's bloom_lambada: greedy generation with a KV cache, as many
    /// new tokens as the batch's longest target; correct when the generated ids start with the
    /// target's).
    #[arg(long, value_enum, default_value_t = Mode::Score)]
    pub mode: Mode,

    /// --mode generate: exit 1 when the accuracy is below X (FasterTransformer's CI gate).
    #[arg(long, value_name = "X")]
    pub acc_threshold: Option<f64>,

    /// --suite generation: prompt length in tokens; a list runs a sweep [default: the suite
    /// file's, 128].
    #[arg(
        long = "prompt-lens",
        visible_alias = "prompt-len",
        value_delimiter = ',',
        value_name = "N"
    )]
    pub prompt_lens: Vec<usize>,

    /// --suite generation: new tokens per prompt (exactly, no stop at EOS); a list runs a
    /// sweep [default: the suite file's, 128].
    #[arg(long = "new-tokens", value_delimiter = ',', value_name = "N")]
    pub new_tokens: Vec<usize>,

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

    /// Seed of random weights; for --suite serving also of the arrival times, the lengths and
    /// the prompts' random ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// auto, cpu, cuda or cuda:N. auto: the first visible GPU when this build has CUDA and a
    /// GPU is there (every --tp/--dp rank on its own GPU), else the CPU; the summary and the
    /// log say what it chose and why.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,

    /// Precision: auto (bf16 on GPUs that have it, else fp32), fp32, tf32 (fp32 weights,
    /// matmuls on TF32 tensor cores), fp16, bf16. A list runs a sweep [default: auto].
    #[arg(
        long = "dtype",
        visible_alias = "dtypes",
        value_enum,
        value_delimiter = ','
    )]
    pub dtypes: Vec<DtypeArg>,

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

    /// Scoring and generation: time at least SECS seconds (the sum of the timed batches'
    /// latencies), running the batches again, whole passes, where one pass is shorter.
    /// Throughput counts every timed batch; accuracy and perplexity the first pass. The log
    /// says what was asked and how many passes ran [default: 10 on a GPU, where a pass of
    /// gpt2 over LAMBADA lasts 2 s and host noise decides it; 0 on the CPU, whose runs are
    /// tests, CI and first tries, each pass already seconds long].
    #[arg(long, value_name = "SECS")]
    pub min_time: Option<f64>,

    /// Scoring and generation: time at least N batches (generation: calls), cycling as
    /// --min-time does [default: 10 on a GPU, 0 on the CPU].
    #[arg(long, value_name = "N")]
    pub min_batches: Option<usize>,

    /// Data file (JSONL, {"text": …} a line) [default: the built-in 100-passage sample].
    /// `--data full` looks for the suite's full file in $BENCH_DATA_DIR, ./data and
    /// ~/.cache/transformer-bench.
    #[arg(long, value_name = "PATH")]
    pub data: Option<String>,

    /// Directory of the JSONL run logs.
    #[arg(long, default_value = "results/logs", value_name = "DIR")]
    pub log_dir: PathBuf,

    /// candle (this crate's models), hf (transformers + PyTorch in a Python worker), or both:
    /// the same data, batches and weights through each, then a side-by-side summary; llmc
    /// (--suite wikitext2 only): llm.c's train_gpt2cu on the same blocks, from scratch, bf16,
    /// see --llmc-bin. A list runs a sweep, one process per engine (`both` in it means candle
    /// and hf), and a training sweep ends with one table of every engine [default: candle].
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

    /// HF engine attention. best: before the warm-up, time every attention the model has
    /// (eager, sdpa; BLOOM in transformers 5.x has eager only), each compiled and not with
    /// --hf-compile best, on the run's first batches (the first of each of its first 4 padded
    /// lengths), cold then warm, and keep the candidate whose predicted cost of a timed batch
    /// is lowest: the warm time, plus a new shape's cold cost (compilation, sdpa's set-up) for
    /// the share of timed batches that meet a shape the warm-up did not. Every candidate's
    /// times are in the log header and the candle/HF table. Training takes auto's choice.
    /// auto: sdpa where the model supports it, else eager.
    #[arg(long, value_enum, default_value_t = HfAttn::Best)]
    pub hf_attn: HfAttn,

    /// HF engine under torch.compile: best (scoring and generation: compiled and not are both
    /// candidates of --hf-attn's probe; training: off), on (`--hf-compile` alone), off.
    /// Scoring compiles the body with dynamic shapes; generation uses a static KV cache
    /// (generate() compiles its decoding step, again for each new shape); training compiles
    /// the model as HF Trainer's torch_compile=True, in the first step. Compilation falls in
    /// the warm-up (the summary counts any inside the timed batches: compiles_timed); the log
    /// records compile=true and reports name the engine hf-compile. `on` makes --pad-multiple
    /// default to 64, so that scoring compiles once per bucket of 64 positions.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on",
          default_value_t = HfCompile::Best, value_name = "WHEN")]
    pub hf_compile: HfCompile,

    /// HF engine: one configuration named whole, instead of --hf-attn and --hf-compile: best,
    /// eager, sdpa, eager+compile or sdpa+compile.
    #[arg(long, value_parser = crate::engines::hf::parse_hf_config, value_name = "CONFIG",
          conflicts_with_all = ["hf_attn", "hf_compile"])]
    pub hf_config: Option<(HfAttn, HfCompile)>,

    /// Pad every LAMBADA batch and every batch of generation prompts (both engines) to a
    /// multiple of N positions: a compiled engine then meets a few shapes instead of one per
    /// padded length. Padding is masked, so scores and generated ids do not change [default:
    /// 1 (each batch to its longest row); 64 with --hf-compile].
    #[arg(long, value_name = "N")]
    pub pad_multiple: Option<usize>,

    /// candle engine on CUDA: the fused paths to use (comma list). all; none (candle's own
    /// ops, for comparison); lt (inference projections as one cuBLASLt matmul with bias and
    /// GELU in its epilogue); softmax (attention scale + mask + softmax + dropout in one
    /// kernel, and its backward); bias-act (bias + activation in one kernel, and its
    /// backward); adamw (AdamW in two kernels per tensor, the gradient norm in one, the clip
    /// folded in); layer-norm (training LayerNorm as one kernel, and its backward); dropout
    /// (masks hashed inside the kernels instead of stored); cross-entropy (the training loss
    /// in one kernel each way, GPT-2's lm head padded to 64 columns); decode (generation:
    /// residual add + LayerNorm, single-query attention over the KV cache, argmax); graph
    /// (generation: decode steps replayed as a CUDA graph); embedding (training: the token
    /// embedding's gradient in one scatter-add kernel); step (not in all: opt in with
    /// all,step; a decode step of 1–4 rows as one persistent kernel, measured no faster).
    /// docs/perf-notes.md has the effect of each. No effect on CPU.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub fused: Vec<crate::kernels::Fused>,

    /// HF engine: run this worker script instead of the built-in one (development, tests).
    #[arg(long, value_name = "PATH", hide = true)]
    pub hf_worker: Option<PathBuf>,

    /// --engine llmc: llm.c's train_gpt2cu [default: $LLMC_BIN]. bench writes the suite's
    /// train and eval blocks as llm.c token files, runs it from scratch (-e d12 for gpt2;
    /// d24/d36/d48 for gpt2-medium/large/xl) with the same batch, block size, steps (warm-up
    /// included), learning rate and linear schedule, bf16 on cuda:0, and logs its step lines
    /// as the other engines' steps (warm-up steps not timed).
    #[arg(long, value_name = "PATH")]
    pub llmc_bin: Option<PathBuf>,

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
    /// averaged over NCCL (TCP on CPUs) in 128 MiB buckets after the backward (or under it:
    /// --dp-overlap). Launched like --tp; cannot be
    /// combined with --tp. Rank 0 logs, with every rank's peak memory and the share of time
    /// in all-reduces.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub dp: usize,

    /// With --dp, what the ranks split (ZeRO stages): 0 nothing, every rank keeps a whole copy;
    /// 1 the AdamW state (each rank updates the parameters it owns, then shares them); 2 also
    /// the gradients, reduce-scattered block by block as the backward makes them, and the
    /// fp32 masters' update (FSDP's SHARD_GRAD_OP); 3 also the weights, all-gathered block by
    /// block in the forward and the backward and freed after use (FSDP's FULL_SHARD; GPT-2's
    /// manual backward). Composes with --recompute and --grad-accum.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,

    /// With --dp and GPT-2's manual backward, one micro-batch a step: start each block's
    /// gradient all-reduce as soon as the backward has made it, on a second CUDA stream under
    /// the rest of the backward, instead of all of them after it; two ranks of one host copy
    /// them over NVLink by copy engines instead (--fused copy-sum). Off by default: on 2x H200
    /// it moved the step by -1 to +3 % (the backward slows beside it; docs/perf-notes.md).
    #[arg(long)]
    pub dp_overlap: bool,

    /// With --dp N (N >= 2), a training suite: lay data-parallel strategies side by side, each
    /// a configuration of a sweep (a child process launching its N ranks; OOM recorded), with
    /// --recompute off,on and --batch-sizes as further axes: e.g. `--strategies
    /// dp,zero1,zero2,zero3 --recompute off,on --batch-sizes 8,16,32`. The sweep ends with a
    /// table a configuration a column (time per epoch, tokens/s, peak memory and its share of
    /// the GPU); extract-metrics reads the same logs (columns strategy, recompute, batch_size).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "LIST")]
    pub strategies: Vec<Strategy>,

    /// With --tp or --dp: seconds to wait for every rank to join (model loading comes after).
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    pub rdzv_timeout: u64,

    #[command(flatten)]
    pub train: TrainArgs,

    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `--strategies`: how the `--dp` ranks share the model, each a configuration of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Plain data parallelism: a whole copy on every rank (--zero 0).
    Dp,
    /// ZeRO-1: the AdamW state split.
    Zero1,
    /// ZeRO-2: the gradients and the masters' update split too.
    Zero2,
    /// ZeRO-3: the weights split too, gathered block by block (FSDP's full shard).
    Zero3,
}

impl Strategy {
    /// The `--zero` level it runs at.
    pub fn zero(self) -> u8 {
        self as u8
    }
}

/// Training suites (`--suite wikitext2`, `--suite shakespeare`): HF Trainer / run_clm
/// defaults unless given.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Training (--suite wikitext2, shakespeare)")]
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
    /// candle engine: how gradients are computed. manual: GPT-2's forward and backward
    /// written per block, no autograd graph (GPT-2 only; the same gradients as autograd, about
    /// 1.7x its speed on an H100); autograd: candle's autograd through the model's ops
    /// [default: manual for GPT-2, autograd for BLOOM].
    #[arg(long, value_enum)]
    pub backward: Option<crate::train::Backward>,
    /// Time forward, backward and optimizer update of each step (synchronizes the device
    /// between them, which costs a little throughput); logged per step, medians in the summary.
    #[arg(long)]
    pub phase_times: bool,
    /// Activation checkpointing (candle's manual GPT-2 step; HF: `on` only, its gradient
    /// checkpointing). on (= blocks): each block keeps its input only and runs its whole
    /// forward again in the backward, about a third more compute a step. mlp: each block keeps
    /// its attention half (6 C of 16 C a token, C the width) and runs its LayerNorms and the
    /// MLP's first matmul again, about a ninth more matmul work. The same gradients either way;
    /// peak memory is logged. `--recompute` alone is `on`; a list (`off,on,mlp`) is a sweep axis.
    #[arg(long, value_enum, value_name = "off|on|blocks|mlp", num_args = 0..=1, default_missing_value = "on", value_delimiter = ',')]
    pub recompute: Vec<crate::train::Recompute>,
    /// Drop each epoch's last partial batch (HF's dataloader_drop_last), for every engine of
    /// the run: every step then has one shape, so a compiled engine does not recompile in a
    /// timed step [default: on with --hf-compile, else off].
    #[arg(long)]
    pub drop_last: bool,
    /// Write the trained weights (fp32) as an HF checkpoint (config.json + model.safetensors).
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,
}

impl TrainArgs {
    /// The first training flag given, for the error when the suite does not train.
    pub(super) fn given(&self) -> Option<&'static str> {
        [
            (self.eval_data.is_some(), "--eval-data"),
            (self.block_size.is_some(), "--block-size"),
            (self.epochs.is_some(), "--epochs"),
            (self.max_steps.is_some(), "--max-steps"),
            (self.grad_accum.is_some(), "--grad-accum"),
            (self.lr.is_some(), "--lr"),
            (self.lr_warmup_steps.is_some(), "--lr-warmup-steps"),
            (self.no_dropout, "--no-dropout"),
            (self.backward.is_some(), "--backward"),
            (self.phase_times, "--phase-times"),
            (self.drop_last, "--drop-last"),
            (!self.recompute.is_empty(), "--recompute"),
            (self.save.is_some(), "--save"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// The serving suite (`--suite serving`): its load, over the suite file's `[serving]`.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Serving (--suite serving)")]
pub struct ServeArgs {
    /// Open loop: requests sent per second (`inf`: all at once) [default: the suite file's,
    /// 16; inf with --max-concurrency alone]. A list (`1,2,4,inf`) is a sweep: one run per
    /// rate, each its own child process and log.
    #[arg(long, value_name = "R[,R…]", value_delimiter = ',')]
    pub request_rate: Vec<String>,
    /// Inter-arrival times drawn from a gamma of shape B, scale 1/(R·B) (vLLM's): 1 is a
    /// Poisson process, below 1 burstier, above 1 more even [default: 1].
    #[arg(long, value_name = "B")]
    pub burstiness: Option<f64>,
    /// Closed loop: at most C requests in flight; a request is sent when one finishes (and
    /// not before its time under --request-rate).
    #[arg(long, value_name = "C")]
    pub max_concurrency: Option<usize>,
    /// Timed requests, after the untimed warm-up calls [default: the suite file's, 64].
    #[arg(long, value_name = "N")]
    pub num_requests: Option<usize>,
    /// Prompt tokens (random ids): N, or A:B drawn uniformly per request [default: 128].
    #[arg(long, value_name = "N|A:B")]
    pub input_len: Option<String>,
    /// Output tokens, exactly (EOS banned): N, or A:B drawn uniformly [default: 64].
    #[arg(long, value_name = "N|A:B")]
    pub output_len: Option<String>,
    /// Goodput's limits: requests/s whose time to first token is at most X ms and time per
    /// output token (the first excluded) at most Y ms.
    #[arg(long, value_name = "ttft_ms=X,tpot_ms=Y")]
    pub slo: Option<String>,
    /// continuous: --batch-size slots that requests join and leave between decode steps;
    /// static: the arrived requests as one generation call, the next when it returns
    /// [default: the suite file's, continuous].
    #[arg(long, value_name = "continuous|static")]
    pub batching: Option<String>,
}

impl ServeArgs {
    /// The first serving flag given, for the error when the suite does not serve.
    pub(super) fn given(&self) -> Option<&'static str> {
        [
            (!self.request_rate.is_empty(), "--request-rate"),
            (self.burstiness.is_some(), "--burstiness"),
            (self.max_concurrency.is_some(), "--max-concurrency"),
            (self.num_requests.is_some(), "--num-requests"),
            (self.input_len.is_some(), "--input-len"),
            (self.output_len.is_some(), "--output-len"),
            (self.slo.is_some(), "--slo"),
            (self.batching.is_some(), "--batching"),
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
