//! Runs a resolved benchmark: load, warm up, time every batch, write the log, summarize.

use crate::data::{lambada_passages, DataFile};
use crate::device::{DeviceSpec, Precision};
use crate::env::HostInfo;
use crate::error::Result;
use crate::metrics::{lambada_accuracy, lambada_perplexity, per_second, Distribution};
use crate::models::weights::save_checkpoint;
use crate::models::{ModelSpec, Recorder, WeightSource};
use crate::record::{BatchRecord, DataInfo, Header, Record, RunLog, Summary, SCHEMA_VERSION};
use crate::suites::lambada::{batch_shape, build_requests, score_batch, warm_up};
use crate::suites::SuiteFile;
use crate::tokenizer::TextTokenizer;
use crate::trackers::peak_rss_bytes;
use crate::trackers::{LatencyTracker, MemoryTracker};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    pub data: DataFile,
    pub log_dir: PathBuf,
    /// Write the random weights as an HF checkpoint here.
    pub save_weights: Option<PathBuf>,
    pub command_line: Vec<String>,
    pub progress: bool,
}

pub struct RunOutcome {
    pub log_path: PathBuf,
    pub header: Header,
    pub summary: Summary,
}

/// `git describe`-style commit baked in at build time (build.rs).
pub const GIT_COMMIT: &str = env!("TB_GIT_COMMIT");

pub fn run(spec: RunSpec) -> Result<RunOutcome> {
    let wall = Instant::now();
    let device = spec.device.open()?;
    spec.precision.apply_matmul_mode(&device);
    let tokenizer =
        TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;

    // Data first: bad data fails before minutes of model loading.
    let mut passages = lambada_passages(&spec.data)?;
    if let Some(n) = spec.limit {
        passages.truncate(n);
    }

    // A failed memory query costs the memory figure, not the run.
    let memory = MemoryTracker::start(&device)
        .inspect_err(|e| eprintln!("warning: memory tracking unavailable: {e}"))
        .ok();
    let load = Instant::now();
    let dtype = spec.precision.dtype();
    let record = spec.save_weights.as_ref().map(|_| Recorder::default());
    let model = spec
        .model
        .load_recording(&spec.weights, dtype, &device, record.clone())?;
    crate::device::synchronize(&device)?;
    let load_seconds = load.elapsed().as_secs_f64();
    if let (Some(dir), Some(record)) = (&spec.save_weights, record) {
        let tensors = std::mem::take(&mut *record.lock().expect("recorder lock"));
        save_checkpoint(dir, &spec.model.hf_config(dtype), tensors)?;
        eprintln!(
            "saved weights to {} (config.json + model.safetensors)",
            dir.display()
        );
    }

    let requests = build_requests(&tokenizer, &passages, model.max_positions())?;
    let batches: Vec<&[_]> = requests.chunks(spec.batch_size.max(1)).collect();

    let sha256 = spec.data.sha256();
    let header = Header {
        schema_version: SCHEMA_VERSION,
        tool: "transformer-bench".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: GIT_COMMIT.into(),
        time_utc: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command_line: spec.command_line.clone(),
        engine: "candle".into(),
        suite: spec.suite.name.clone(),
        model: spec.model.info(&spec.weights),
        tokenizer: tokenizer.describe().into(),
        dtype: spec.precision.to_string(),
        device: spec.device.to_string(),
        host: HostInfo::collect(&device),
        batch_size: spec.batch_size,
        warmup_batches: spec.warmup_batches,
        seed: match spec.weights {
            WeightSource::Random { seed } => Some(seed),
            WeightSource::Dir(_) => None,
        },
        limit: spec.limit,
        data: DataInfo {
            path: spec.data.origin.clone(),
            matches_reference: Path::new(&spec.data.origin)
                .file_name()
                .filter(|n| n.to_string_lossy() == spec.suite.data.file)
                .map(|_| sha256 == spec.suite.data.sha256),
            sha256,
            n_samples: requests.len(),
        },
        load_seconds,
    };
    if header.data.matches_reference == Some(false) {
        eprintln!(
            "warning: {} has sha256 {}, not the suite's {}: results are not comparable with the reference set",
            header.data.path, header.data.sha256, spec.suite.data.sha256
        );
    }
    let stem = format!(
        "{}_{}_{}_bs{}_{}_{}",
        header.suite,
        header.model.name,
        header.dtype,
        header.batch_size,
        header.device.replace(':', ""),
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
    );
    let mut log = RunLog::create(&spec.log_dir, &stem)?;
    log.write(&Record::Header(Box::new(header.clone())))?;

    let warm: Vec<&[_]> = batches.iter().take(spec.warmup_batches).copied().collect();
    warm_up(model.as_ref(), &warm, &device)?;

    let bar = progress_bar(spec.progress, requests.len() as u64);
    let mut latencies = Vec::with_capacity(batches.len());
    let (mut lls, mut greedy, mut n_tokens) = (vec![], vec![], 0);
    let mut timer = LatencyTracker::new(&device);
    let mut failure = None;
    for (i, batch) in batches.iter().enumerate() {
        timer.start()?;
        let results = match score_batch(model.as_ref(), batch, &device) {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let latency_ms = timer.stop_ms()?;
        let shape = batch_shape(batch);
        latencies.push(latency_ms);
        n_tokens += shape.n_tokens;
        lls.extend(results.iter().map(|r| r.ll));
        greedy.extend(results.iter().map(|r| r.greedy));
        log.write(&Record::Batch(BatchRecord {
            batch: i,
            n_samples: batch.len(),
            n_tokens: shape.n_tokens,
            padded_len: shape.padded_len,
            latency_ms,
            passages: results,
        }))?;
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();

    let timed_seconds = latencies.iter().sum::<f64>() / 1e3;
    let lat = Distribution::of(&latencies);
    let mem = memory
        .map(|m| m.read())
        .transpose()
        .unwrap_or_else(|e| {
            eprintln!("warning: memory tracking failed: {e}");
            None
        })
        .unwrap_or_default();
    let summary = Summary {
        status: if failure.is_some() {
            "error".into()
        } else {
            "ok".into()
        },
        error: failure.as_ref().map(|e| e.to_string()),
        n_samples: lls.len(),
        n_batches: latencies.len(),
        n_tokens,
        accuracy: lambada_accuracy(&greedy),
        perplexity: lambada_perplexity(&lls),
        samples_per_second: per_second(lls.len() as f64, timed_seconds),
        tokens_per_second: per_second(n_tokens as f64, timed_seconds),
        latency_ms_p50: lat.p50,
        latency_ms_p90: lat.p90,
        latency_ms_p99: lat.p99,
        latency_ms_mean: lat.mean,
        latency_ms_stdev: lat.stdev,
        timed_seconds,
        wall_seconds: wall.elapsed().as_secs_f64(),
        peak_memory_bytes: mem.peak_bytes,
        peak_host_memory_bytes: peak_rss_bytes(),
        device_memory_used_bytes: mem.device_used_bytes,
    };
    log.write(&Record::Summary(Box::new(summary.clone())))?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(RunOutcome {
        log_path: log.path().to_path_buf(),
        header,
        summary,
    })
}

fn progress_bar(enabled: bool, len: u64) -> ProgressBar {
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
        "{} | {} ({:.2}M params, weights {}) | {} | {} | batch {}\n",
        h.suite,
        h.model.name,
        h.model.n_parameters as f64 / 1e6,
        h.model.weights,
        h.dtype,
        h.device,
        h.batch_size
    );
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
    for (k, v) in rows {
        t += &format!("  {k:<18} {v}\n");
    }
    t += &format!("log: {}\n", log_path.display());
    t
}
