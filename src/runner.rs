//! Runs a resolved benchmark: load, warm up, time every batch, write the log, summarize.

use crate::data::{lambada_passages, DataFile};
use crate::device::{DeviceSpec, Precision};
use crate::dist::group::RankContext;
use crate::engines::candle::CandleEngine;
use crate::engines::hf::{HfEngine, HfOptions};
use crate::engines::{Engine, EngineKind};
use crate::env::{nvml_index, EnvReport, GpuInfo};
use crate::error::{failure_status, Error, Result};
use crate::flops::{lambada_forward_flops, mfu, peak_tflops, ModelShape};
use crate::metrics::{lambada_accuracy, lambada_perplexity, per_second, Distribution};
use crate::models::weights::save_checkpoint;
use crate::models::{ModelSpec, Recorder, WeightSource};
use crate::record::{
    BatchRecord, DataInfo, Header, RankLog, Record, Summary, TpInfo, SCHEMA_VERSION,
};
use crate::suites::lambada::{batch_shape, build_requests, passage_results};
use crate::suites::SuiteFile;
use crate::tokenizer::TextTokenizer;
use crate::trackers::{
    peak_rss_bytes, EnergyTracker, GpuSampler, MemoryReading, MemoryTracker, NvmlGpu,
};
use candle_core::{DType, Device};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Everything a run needs, resolved from flags and the suite file.
pub struct RunSpec {
    pub suite: SuiteFile,
    pub model: ModelSpec,
    pub weights: WeightSource,
    pub tokenizer_dir: Option<PathBuf>,
    pub device: DeviceSpec,
    pub precision: Precision,
    pub batch_size: usize,
    pub warmup_batches: usize,
    pub limit: Option<usize>,
    /// Left-truncate contexts to this many tokens (None: the model's maximum).
    pub seq_len: Option<usize>,
    /// Repeat index when a sweep runs this configuration several times.
    pub repeat: Option<usize>,
    pub data: DataFile,
    pub log_dir: PathBuf,
    /// Write the random weights as an HF checkpoint here.
    pub save_weights: Option<PathBuf>,
    pub engine: EngineKind,
    pub hf: HfOptions,
    pub command_line: Vec<String>,
    pub progress: bool,
    /// `--seed`: random weights and, for training, the data order.
    pub seed: u64,
    /// Training suites (wikitext2).
    pub train: Option<crate::train_runner::TrainOptions>,
    /// This process is one rank of a tensor-parallel group (`--tp N`).
    pub tp: Option<RankContext>,
    /// This process is one rank of a data-parallel training group (`--dp N`).
    pub dp: Option<DpRun>,
}

/// A data-parallel rank: its group, and whether the optimizer state is split (ZeRO-1).
#[derive(Clone)]
pub struct DpRun {
    pub ctx: RankContext,
    pub zero1: bool,
}

impl RunSpec {
    /// Whether this process writes the log and prints results: always, except the ranks of a
    /// tensor-parallel group other than rank 0.
    pub fn is_logging_rank(&self) -> bool {
        let rank = match (&self.tp, &self.dp) {
            (Some(t), _) => t.group.rank,
            (_, Some(d)) => d.ctx.group.rank,
            _ => 0,
        };
        rank == 0
    }
}

pub struct RunOutcome {
    pub log_path: PathBuf,
    pub header: Header,
    pub summary: Summary,
}

/// `git describe`-style commit baked in at build time (build.rs).
pub const GIT_COMMIT: &str = env!("TB_GIT_COMMIT");

/// Runs `spec` with each engine it names, in order; one outcome per engine.
/// The HF engine reads an HF checkpoint: with random weights, candle writes them once (cached by
/// model, seed, device kind and dtype) and every engine of the run reads that same file.
pub fn run(spec: RunSpec) -> Result<Vec<RunOutcome>> {
    match spec.engine {
        EngineKind::Candle => Ok(vec![run_engine(&spec, EngineKind::Candle, &spec.weights)?]),
        kind => {
            HfEngine::preflight(&spec.hf)?;
            let weights = WeightSource::Dir(hf_checkpoint(&spec)?);
            let mut out = vec![];
            if kind == EngineKind::Both {
                out.push(run_engine(&spec, EngineKind::Candle, &weights)?);
            }
            out.push(run_engine(&spec, EngineKind::Hf, &weights)?);
            Ok(out)
        }
    }
}

/// Where random weights for the HF engine are cached: `$BENCH_CACHE_DIR` or
/// `~/.cache/transformer-bench`, then `weights/MODEL-seedN-DEVICE`. Stored in fp32, once for
/// every precision: both engines cast on load (round to nearest even), so their fp16/bf16
/// weights are identical too.
pub fn weight_cache_dir(model: &str, seed: u64, device: DeviceSpec) -> PathBuf {
    let root = std::env::var_os("BENCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/transformer-bench"))
        })
        .unwrap_or_else(|| PathBuf::from(".cache/transformer-bench"));
    let kind = match device {
        DeviceSpec::Cpu => "cpu",
        DeviceSpec::Cuda(_) => "cuda",
    };
    root.join("weights")
        .join(format!("{model}-seed{seed}-{kind}"))
}

/// The checkpoint directory the HF engine loads.
pub(crate) fn hf_checkpoint(spec: &RunSpec) -> Result<PathBuf> {
    let seed = match &spec.weights {
        WeightSource::Dir(d) => return Ok(d.clone()),
        WeightSource::Random { seed } => *seed,
    };
    let dtype = DType::F32;
    let dir = spec
        .save_weights
        .clone()
        .unwrap_or_else(|| weight_cache_dir(&spec.model.name, seed, spec.device));
    if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
        return Ok(dir);
    }
    // Written under a temporary name, then renamed: a crash never leaves a half checkpoint
    // that a later run would take for a whole one.
    let tmp = dir.with_extension(format!("partial-{}", std::process::id()));
    let device = spec.device.open()?;
    let record = Recorder::default();
    let model = spec
        .model
        .load_recording(&spec.weights, dtype, &device, Some(record.clone()))?;
    drop(model);
    let tensors = std::mem::take(&mut *record.lock().expect("recorder lock"));
    save_checkpoint(&tmp, &spec.model.hf_config(dtype), tensors)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| Error::io(format!("replacing {}", dir.display()), e))?;
    }
    std::fs::rename(&tmp, &dir)
        .map_err(|e| Error::io(format!("moving weights to {}", dir.display()), e))?;
    eprintln!(
        "wrote random weights (seed {seed}) for the HF engine to {}",
        dir.display()
    );
    Ok(dir)
}

/// The header fields every run shares: tool, commit, time, command line, model, precision,
/// host. Each runner adds its engine, data and suite fields with struct update syntax.
pub(crate) fn base_header(
    spec: &RunSpec,
    weights: &WeightSource,
    tokenizer: &TextTokenizer,
    host: EnvReport,
    data: DataInfo,
) -> Header {
    Header {
        schema_version: SCHEMA_VERSION,
        tool: "transformer-bench".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: GIT_COMMIT.into(),
        time_utc: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command_line: spec.command_line.clone(),
        engine: String::new(),
        engine_info: Default::default(),
        suite: spec.suite.name.clone(),
        model: spec.model.info(weights, &spec.weights),
        tokenizer: tokenizer.describe().into(),
        dtype: spec.precision.to_string(),
        device: spec.device.to_string(),
        host,
        gpu_index: None,
        batch_size: spec.batch_size,
        warmup_batches: spec.warmup_batches,
        seed: None,
        limit: None,
        data,
        load_seconds: 0.,
        seq_len: None,
        repeat: spec.repeat,
        train: None,
        tp: spec.tp.as_ref().map(|t| TpInfo {
            size: t.group.size,
            backend: t.backend.clone(),
            launcher: format!("{:?}", t.world.launcher),
            ranks: t.peers.clone(),
        }),
        dp: None,
    }
}

/// A run log's file stem: `SUITE_MODEL_ENGINE_DTYPE_bsN_DEVICE[_tpN]_TIME`.
pub(crate) fn log_stem(h: &Header) -> String {
    format!(
        "{}_{}_{}_{}_bs{}_{}{}_{}",
        h.suite,
        h.model.name,
        h.engine,
        h.dtype,
        h.batch_size,
        h.device.replace(':', ""),
        h.tp.as_ref()
            .map(|t| format!("_tp{}", t.size))
            .unwrap_or_default(),
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
    )
}

/// Loads the candle engine; with `--save-weights`, also writes the random weights.
fn candle_engine(spec: &RunSpec, weights: &WeightSource) -> Result<(Box<dyn Engine>, Device)> {
    let device = match &spec.tp {
        Some(t) => t.device.clone(),
        None => spec.device.open()?,
    };
    spec.precision.apply_matmul_mode(&device);
    // A failed memory query costs the memory figure, not the run.
    let memory = MemoryTracker::start(&device)
        .inspect_err(|e| eprintln!("warning: memory tracking unavailable: {e}"))
        .ok();
    let dtype = spec.precision.dtype();
    let save = spec
        .save_weights
        .as_ref()
        .filter(|_| spec.engine == EngineKind::Candle);
    let record = save.map(|_| Recorder::default());
    let load = Instant::now();
    let model = match &spec.tp {
        Some(t) => spec.model.load_shard(weights, dtype, &device, &t.group)?,
        None => spec
            .model
            .load_recording(weights, dtype, &device, record.clone())?,
    };
    crate::device::synchronize(&device)?;
    let load_seconds = load.elapsed().as_secs_f64();
    if let (Some(dir), Some(record)) = (save, record) {
        let tensors = std::mem::take(&mut *record.lock().expect("recorder lock"));
        save_checkpoint(dir, &spec.model.hf_config(dtype), tensors)?;
        eprintln!(
            "saved weights to {} (config.json + model.safetensors)",
            dir.display()
        );
    }
    let engine = CandleEngine {
        model,
        device: device.clone(),
        memory,
        load_seconds,
    };
    Ok((Box::new(engine), device))
}

fn run_engine(spec: &RunSpec, kind: EngineKind, weights: &WeightSource) -> Result<RunOutcome> {
    let wall = Instant::now();
    let tokenizer =
        TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;

    // Data first: bad data fails before minutes of model loading.
    let mut passages = lambada_passages(&spec.data)?;
    if let Some(n) = spec.limit {
        passages.truncate(n);
    }

    let mut cuda_uuid = None;
    let (mut engine, host) = match (kind, weights) {
        (EngineKind::Hf, WeightSource::Dir(dir)) => {
            let engine = HfEngine::start(&spec.hf, dir, spec.precision, spec.device)?;
            // NVML opens no CUDA context, so no GPU memory is taken from the worker.
            let mut host = EnvReport::collect();
            if let (true, Some(gpu)) = (host.gpus.is_empty(), engine.info().get("gpu")) {
                let index = match spec.device {
                    DeviceSpec::Cuda(n) => n,
                    DeviceSpec::Cpu => 0,
                };
                host.gpus.push(GpuInfo {
                    index,
                    name: gpu.clone(),
                    ..Default::default()
                });
            }
            (Box::new(engine) as Box<dyn Engine>, host)
        }
        (EngineKind::Hf, WeightSource::Random { .. }) => {
            return Err(Error::Config(
                "the HF engine loads a checkpoint: random weights are written first".into(),
            ))
        }
        _ => {
            let (engine, device) = candle_engine(spec, weights)?;
            cuda_uuid = crate::device::cuda_uuid(&device);
            (engine, EnvReport::collect())
        }
    };

    let max_len = match spec.seq_len {
        Some(n) if n > engine.max_positions() => {
            return Err(Error::Config(format!(
                "--seq-len {n} is longer than the model's {} positions",
                engine.max_positions()
            )))
        }
        Some(n) => n,
        None => engine.max_positions(),
    };
    let requests = build_requests(&tokenizer, &passages, max_len)?;
    let batches: Vec<&[_]> = requests.chunks(spec.batch_size.max(1)).collect();

    let gpu_index = match spec.device {
        DeviceSpec::Cuda(ordinal) => {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            nvml_index(
                ordinal,
                cuda_uuid.as_deref(),
                visible.as_deref(),
                &host.gpus,
            )
            .filter(|&i| host.gpu(i).is_some())
        }
        DeviceSpec::Cpu => None,
    };
    let sha256 = spec.data.sha256();
    let data = DataInfo {
        path: spec.data.origin.clone(),
        matches_reference: Path::new(&spec.data.origin)
            .file_name()
            .filter(|n| n.to_string_lossy() == spec.suite.data.file)
            .map(|_| sha256 == spec.suite.data.sha256),
        sha256,
        n_samples: requests.len(),
    };
    let header = Header {
        engine: engine.name().into(),
        engine_info: engine.info(),
        gpu_index,
        seed: match spec.weights {
            WeightSource::Random { seed } => Some(seed),
            WeightSource::Dir(_) => None,
        },
        limit: spec.limit,
        load_seconds: engine.load_seconds(),
        seq_len: spec.seq_len,
        ..base_header(spec, weights, &tokenizer, host, data)
    };
    let logging = spec.is_logging_rank();
    if header.data.matches_reference == Some(false) && logging {
        eprintln!(
            "warning: {} has sha256 {}, not the suite's {}: results are not comparable with the reference set",
            header.data.path, header.data.sha256, spec.suite.data.sha256
        );
    }
    let stem = log_stem(&header);
    // Every rank runs every batch (each forward has all-reduces); only rank 0 logs.
    let mut log = RankLog::create(logging, &spec.log_dir, &stem)?;
    log.write(&Record::Header(Box::new(header.clone())))?;

    // Untimed warm-up batches: CUDA loads candle's PTX kernels, cuBLAS creates handles and the
    // memory pools grow on first use; none of that is the model's speed. A failure here (an
    // out-of-memory at a large batch) is recorded like one in the timed batches.
    let mut failure = batches
        .iter()
        .take(spec.warmup_batches)
        .find_map(|batch| engine.score(batch).err());

    // NVML trackers over the timed loop only (warm-up excluded, as for latency).
    let gpu = gpu_trackers(spec.device, header.gpu_index, engine.pid());
    let shape = ModelShape::of(&spec.model);
    let mut model_flops = 0.;

    let bar = progress_bar(spec.progress && logging, requests.len() as u64);
    let mut totals = BatchTotals::default();
    for (i, batch) in batches.iter().enumerate() {
        if failure.is_some() {
            break;
        }
        let scored = engine
            .score(batch)
            .and_then(|out| Ok((passage_results(batch, &out.scores)?, out.latency_ms)));
        let (results, latency_ms) = match scored {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let bs = batch_shape(batch);
        model_flops += batch
            .iter()
            .map(|r| lambada_forward_flops(&shape, r.input.len(), r.target_tokens.len()))
            .sum::<f64>();
        let record = BatchRecord {
            batch: i,
            n_samples: batch.len(),
            n_tokens: bs.n_tokens,
            padded_len: bs.padded_len,
            latency_ms,
            passages: results,
        };
        totals.add(&record);
        log.write(&Record::Batch(record))?;
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    let (activity, energy) = match gpu {
        Some((sampler, energy)) => (
            Some(sampler.stop()),
            energy.and_then(|e| {
                e.stop()
                    .inspect_err(|e| eprintln!("warning: energy tracking failed: {e}"))
                    .ok()
            }),
        ),
        None => (None, None),
    };

    let mem = if failure.is_some() {
        MemoryReading::default()
    } else {
        engine.finish().unwrap_or_else(|e| {
            eprintln!("warning: memory tracking failed: {e}");
            MemoryReading::default()
        })
    };
    let mut summary = totals.summary(
        failure
            .as_ref()
            .map(|e| crate::error::message_without_backtrace(&e.to_string())),
        wall.elapsed().as_secs_f64(),
        mem,
    );
    let peak = header
        .gpu_index
        .and_then(|i| header.host.gpu(i))
        .and_then(|g| peak_tflops(&g.name, spec.precision));
    let model_flops = (model_flops > 0.).then_some(model_flops);
    let (achieved, mfu) = mfu(model_flops.unwrap_or(0.), summary.timed_seconds, peak);
    let act = activity.unwrap_or_default();
    let n_samples = summary.n_samples;
    summary = Summary {
        nvml_peak_process_memory_bytes: act.peak_process_memory_bytes,
        nvml_peak_device_memory_used_bytes: act.peak_device_memory_used_bytes,
        sm_clock_mhz_median: act.sm_clock_mhz_median,
        gpu_utilization_percent_median: act.utilization_percent_median,
        power_watts_mean: act.power_watts_mean,
        gpu_samples: activity.map(|a| a.n_samples),
        energy_joules: energy.map(|e| e.joules),
        energy_seconds: energy.map(|e| e.seconds),
        joules_per_sample: energy
            .filter(|_| n_samples > 0)
            .map(|e| e.joules / n_samples as f64),
        model_flops,
        achieved_tflop_per_second: achieved,
        peak_tflop_per_second: peak,
        mfu,
        ..summary
    };
    log.write(&Record::Summary(Box::new(summary.clone())))?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(RunOutcome {
        log_path: log.path(),
        header,
        summary,
    })
}

/// What the finished batches of a run add up to; the one place a [`Summary`] is computed,
/// for a whole run and for a killed run's log completed later (see `crate::sweep`).
#[derive(Default)]
pub struct BatchTotals {
    latencies_ms: Vec<f64>,
    lls: Vec<f64>,
    greedy: Vec<bool>,
    n_tokens: usize,
}

impl BatchTotals {
    pub fn add(&mut self, batch: &BatchRecord) {
        self.latencies_ms.push(batch.latency_ms);
        self.n_tokens += batch.n_tokens;
        self.lls.extend(batch.passages.iter().map(|p| p.ll));
        self.greedy.extend(batch.passages.iter().map(|p| p.greedy));
    }

    /// `failure`: the error that ended the run early, whose words decide `oom` vs `error`.
    pub fn summary(
        &self,
        failure: Option<String>,
        wall_seconds: f64,
        mem: MemoryReading,
    ) -> Summary {
        let timed_seconds = self.latencies_ms.iter().sum::<f64>() / 1e3;
        let lat = Distribution::of(&self.latencies_ms);
        // No finished batch: no latency either (null in the log, not 0).
        let ms = |v: f64| if lat.count == 0 { f64::NAN } else { v };
        let n = self.lls.len();
        let status = failure.as_deref().map_or("ok", failure_status);
        Summary {
            status: status.into(),
            error: failure,
            n_samples: n,
            n_batches: self.latencies_ms.len(),
            n_tokens: self.n_tokens,
            accuracy: if n > 0 {
                lambada_accuracy(&self.greedy)
            } else {
                f64::NAN
            },
            perplexity: if n > 0 {
                lambada_perplexity(&self.lls)
            } else {
                f64::NAN
            },
            samples_per_second: per_second(n as f64, timed_seconds),
            tokens_per_second: per_second(self.n_tokens as f64, timed_seconds),
            latency_ms_p50: ms(lat.p50),
            latency_ms_p90: ms(lat.p90),
            latency_ms_p99: ms(lat.p99),
            latency_ms_mean: ms(lat.mean),
            latency_ms_stdev: ms(lat.stdev),
            timed_seconds,
            wall_seconds,
            peak_memory_bytes: mem.peak_bytes,
            device_memory_used_bytes: mem.device_used_bytes,
            peak_host_memory_bytes: peak_rss_bytes(),
            pool_reserved_bytes: mem.pool_reserved_bytes,
            nvml_peak_process_memory_bytes: None,
            nvml_peak_device_memory_used_bytes: None,
            sm_clock_mhz_median: None,
            gpu_utilization_percent_median: None,
            power_watts_mean: None,
            gpu_samples: None,
            energy_joules: None,
            energy_seconds: None,
            joules_per_sample: None,
            model_flops: None,
            achieved_tflop_per_second: None,
            peak_tflop_per_second: None,
            mfu: None,
        }
    }
}

/// NVML sampler and energy counter on the run's GPU (NVML index `gpu_index`), watching process
/// `pid`; None on CPU. A GPU NVML cannot read costs these figures (with a warning), not the run.
fn gpu_trackers(
    device: DeviceSpec,
    gpu_index: Option<usize>,
    pid: u32,
) -> Option<(GpuSampler, Option<EnergyTracker>)> {
    let DeviceSpec::Cuda(ordinal) = device else {
        return None;
    };
    let gpu = gpu_index
        .ok_or_else(|| Error::Unsupported(format!("no NVML GPU matches cuda:{ordinal}")))
        .and_then(|i| NvmlGpu::open(i, pid))
        .inspect_err(|e| eprintln!("warning: GPU trackers unavailable: {e}"))
        .ok()?;
    let energy = EnergyTracker::start(&gpu)
        .inspect_err(|e| eprintln!("warning: energy tracking unavailable: {e}"))
        .ok();
    Some((GpuSampler::start(gpu, Duration::from_millis(10)), energy))
}

pub(crate) fn progress_bar(enabled: bool, len: u64) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {pos}/{len} passages [{bar:40}] {per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The short table printed on stdout after a run.
pub fn summary_table(h: &Header, s: &Summary, log_path: &Path) -> String {
    let mib = |b: u64| b as f64 / (1024. * 1024.);
    let mut t = String::new();
    t += &format!(
        "{} | {} | {} ({:.2}M params, weights {}) | {} | {} | batch {}\n",
        h.engine,
        h.suite,
        h.model.name,
        h.model.n_parameters as f64 / 1e6,
        h.model.weights,
        h.dtype,
        h.device,
        h.batch_size
    );
    if let Some(tp) = &h.tp {
        t += &format!(
            "tensor parallel: {} ranks over {} ({}), figures from rank 0\n",
            tp.size,
            tp.backend,
            tp.ranks
                .iter()
                .map(|r| format!("{} {}", r.host, r.info["device"].as_str().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let rows = [
        ("passages", format!("{}", s.n_samples)),
        ("accuracy", format!("{:.4}", s.accuracy)),
        ("perplexity", format!("{:.4}", s.perplexity)),
        ("samples/s", format!("{:.2}", s.samples_per_second)),
        ("tokens/s", format!("{:.1}", s.tokens_per_second)),
        (
            "batch latency ms",
            format!(
                "p50 {:.3}  p90 {:.3}  p99 {:.3}  mean {:.3} ± {:.3}",
                s.latency_ms_p50,
                s.latency_ms_p90,
                s.latency_ms_p99,
                s.latency_ms_mean,
                s.latency_ms_stdev
            ),
        ),
        (
            "peak memory",
            format!("{:.1} MiB", mib(s.peak_memory_bytes)),
        ),
        (
            "peak host RSS",
            format!("{:.1} MiB", mib(s.peak_host_memory_bytes.unwrap_or(0))),
        ),
        (
            "load / wall",
            format!("{:.2} s / {:.2} s", h.load_seconds, s.wall_seconds),
        ),
    ];
    let mut rows = rows.to_vec();
    if let Some(nvml) = s.nvml_peak_process_memory_bytes {
        // NVML counts what the driver gave the process; the engine counts its tensors.
        let pool = s.pool_reserved_bytes.unwrap_or(s.peak_memory_bytes);
        rows.push((
            "NVML process peak",
            format!(
                "{:.1} MiB = pool {:.1} MiB reserved ({:.1} used) + {:.1} MiB context, kernels, cuBLAS workspace",
                mib(nvml),
                mib(pool),
                mib(s.peak_memory_bytes),
                (nvml as f64 - pool as f64) / (1024. * 1024.)
            ),
        ));
    }
    if let Some(c) = s.sm_clock_mhz_median {
        rows.push((
            "GPU (median)",
            format!(
                "SM clock {c:.0} MHz, utilisation {:.0} %, mean power {:.0} W",
                s.gpu_utilization_percent_median.unwrap_or(f64::NAN),
                s.power_watts_mean.unwrap_or(f64::NAN)
            ),
        ));
    }
    if let (Some(j), Some(per)) = (s.energy_joules, s.joules_per_sample) {
        rows.push(("energy", format!("{j:.1} J, {per:.4} J/sample")));
    }
    if let Some(a) = s.achieved_tflop_per_second {
        let mfu = match (s.mfu, s.peak_tflop_per_second) {
            (Some(m), Some(p)) => format!(", MFU {:.1}% of {p} TFLOP/s", m * 100.),
            _ => String::new(),
        };
        rows.push(("model FLOP/s", format!("{a:.3} TFLOP/s{mfu}")));
    }
    for (k, v) in rows {
        t += &format!("  {k:<18} {v}\n");
    }
    t += &format!("log: {}\n", log_path.display());
    t
}

/// The candle-vs-HF table of `--engine both`, and whether the two engines agree on the scores:
/// in fp32/tf32 equal accuracy and perplexity within 1e-3 relative; in fp16/bf16, where the
/// engines round differently (HF takes softmax and ALiBi in half precision) and a borderline
/// argmax can flip, accuracy within 0.005 and perplexity within 1e-2.
pub fn side_by_side(candle: &RunOutcome, hf: &RunOutcome) -> (String, bool) {
    let (c, h) = (&candle.summary, &hf.summary);
    let ppl_rel = (c.perplexity - h.perplexity).abs() / h.perplexity;
    let full = matches!(candle.header.dtype.as_str(), "fp32" | "tf32");
    let (tol, acc_tol) = if full { (1e-3, 0.) } else { (1e-2, 5e-3) };
    let agree = (c.accuracy - h.accuracy).abs() <= acc_tol && ppl_rel <= tol;
    let mib = |b: u64| b as f64 / (1024. * 1024.);
    let mut t = format!(
        "\n{:<22} {:>14} {:>14} {:>12}\n",
        "candle vs hf", "candle", "hf", "candle/hf"
    );
    let mut row = |name: &str, a: f64, b: f64, prec: usize| {
        t += &format!("{name:<22} {a:>14.prec$} {b:>14.prec$} {:>12.3}\n", a / b);
    };
    row("samples/s", c.samples_per_second, h.samples_per_second, 2);
    row("tokens/s", c.tokens_per_second, h.tokens_per_second, 1);
    row("latency p50 ms", c.latency_ms_p50, h.latency_ms_p50, 3);
    row("latency p99 ms", c.latency_ms_p99, h.latency_ms_p99, 3);
    row(
        "peak memory MiB",
        mib(c.peak_memory_bytes),
        mib(h.peak_memory_bytes),
        1,
    );
    row("accuracy", c.accuracy, h.accuracy, 4);
    row("perplexity", c.perplexity, h.perplexity, 4);
    t += &format!(
        "scores {} (accuracy {}, perplexity rel. diff {ppl_rel:.2e}, tolerance {tol:.0e})\n",
        if agree { "agree" } else { "DISAGREE" },
        if c.accuracy == h.accuracy {
            "equal".to_string()
        } else {
            format!("differs by {:.4}", (c.accuracy - h.accuracy).abs())
        }
    );
    (t, agree)
}
