//! The LAMBADA scoring scenario: load, warm up, score every batch (timed; again, whole passes,
//! until `--min-time` and `--min-batches`: [`super::passes`]), write the log, summarize. Per
//! engine of the run: the same requests, batches and padding ([`data`]).

pub mod data;

use super::passes::{MinRun, Passes, Slot};
use super::skeleton::{
    base_header, candle_device, choose_config, cold_share, engine_args, engine_runs, final_memory,
    finish_log, first_of_each_shape, gpu_index, group_stops, open_log, shows_progress,
    warm_short_last, warmup_batches, GpuWatch, Padding, PROBE_SHAPES,
};
use super::spec::RunSpec;
use crate::device::DeviceSpec;
use crate::engines::registry;
use crate::engines::{EngineKind, Request, Score};
use crate::env::{EnvReport, GpuInfo};
use crate::error::{message_without_backtrace, Error, Result};
use crate::flops::{lambada_forward_flops, mfu, peak_tflops, ModelShape};
use crate::log::{RankLog, RunOutcome};
use crate::metrics::BatchTotals;
use crate::models::WeightSource;
use crate::progress::Status;
use crate::record::{BatchRecord, DataInfo, Header, Record, Summary};
use crate::tokenizer::TextTokenizer;
use data::{batch_shape, build_requests, passage_results};
use std::path::Path;
use std::time::Instant;

/// Scores `spec` with each engine it names, in order; one outcome per engine.
pub fn run(spec: &RunSpec) -> Result<Vec<RunOutcome<Summary>>> {
    engine_runs(spec)?
        .iter()
        .map(|(kind, weights)| run_engine(spec, *kind, weights))
        .collect()
}

/// An engine that scores, and what is known of its host.
struct Started {
    engine: Box<dyn Score>,
    host: EnvReport,
    cuda_uuid: Option<String>,
}

/// Opens the engine `kind` on `weights` ([`registry::open_score`]); a child engine's GPU,
/// which NVML sees without a CUDA context here, goes into the host report from its info.
fn start(spec: &RunSpec, kind: EngineKind, weights: &WeightSource) -> Result<Started> {
    let open = || candle_device(spec);
    let engine = registry::open_score(kind, &engine_args(spec, weights, &open))?;
    let mut host = EnvReport::collect();
    if let (true, Some(gpu)) = (host.gpus.is_empty(), engine.info().get("gpu").cloned()) {
        let index = match spec.device {
            DeviceSpec::Cuda(n) => n,
            DeviceSpec::Cpu => 0,
        };
        host.gpus.push(GpuInfo {
            index,
            name: gpu,
            ..Default::default()
        });
    }
    Ok(Started {
        cuda_uuid: engine.cuda_uuid(),
        engine,
        host,
    })
}

/// The longest input the run gives the model: `--seq-len`, else the model's maximum.
fn max_len(spec: &RunSpec, engine: &dyn Score) -> Result<usize> {
    match spec.seq_len {
        Some(n) if n > engine.max_positions() => Err(Error::Config(format!(
            "--seq-len {n} is longer than the model's {} positions",
            engine.max_positions()
        ))),
        Some(n) => Ok(n),
        None => Ok(engine.max_positions()),
    }
}

/// The passages as requests ([`build_requests`]), saying so: the full set takes a moment.
pub(crate) fn tokenize(
    spec: &RunSpec,
    tokenizer: &TextTokenizer,
    passages: &[(usize, String)],
    max_len: usize,
) -> Result<Vec<Request>> {
    let n = passages.len();
    let status = Status::spinner(shows_progress(spec), format!("tokenizing {n} passages"));
    let requests = build_requests(tokenizer, passages, max_len)?;
    let secs = status.elapsed().as_secs_f64();
    status.done(format!("tokenized {n} passages in {secs:.2} s"));
    Ok(requests)
}

/// The data's identity; `matches_reference` when the file has the suite's reference name.
pub(crate) fn data_info(spec: &RunSpec, n_samples: usize) -> DataInfo {
    let sha256 = spec.data.sha256();
    DataInfo {
        path: spec.data.origin.clone(),
        matches_reference: Path::new(&spec.data.origin)
            .file_name()
            .filter(|n| n.to_string_lossy() == spec.suite.data.file)
            .map(|_| sha256 == spec.suite.data.sha256),
        sha256,
        n_samples,
    }
}

fn header(
    spec: &RunSpec,
    started: &Started,
    weights: &WeightSource,
    tokenizer: &TextTokenizer,
    n_requests: usize,
) -> Header {
    let engine = &started.engine;
    Header {
        engine: engine.name().into(),
        engine_info: engine.info(),
        gpu_index: gpu_index(spec.device, started.cuda_uuid.as_deref(), &started.host),
        seed: match spec.weights {
            WeightSource::Random { seed } => Some(seed),
            WeightSource::Dir(_) => None,
        },
        limit: spec.limit,
        load_seconds: engine.load_seconds(),
        seq_len: spec.seq_len,
        ..base_header(
            spec,
            weights,
            tokenizer,
            started.host.clone(),
            data_info(spec, n_requests),
        )
    }
}

fn run_engine(
    spec: &RunSpec,
    kind: EngineKind,
    weights: &WeightSource,
) -> Result<RunOutcome<Summary>> {
    let wall = Instant::now();
    let tokenizer =
        TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;
    // Data first: bad data fails before minutes of model loading.
    let mut passages = crate::data::lambada_passages(&spec.data)?;
    if let Some(n) = spec.limit {
        passages.truncate(n);
    }
    let mut started = start(spec, kind, weights)?;
    let requests = tokenize(
        spec,
        &tokenizer,
        &passages,
        max_len(spec, started.engine.as_ref())?,
    )?;
    let batches = Batches::of(spec, &requests, started.engine.max_positions());
    let probe = batches.probe();
    choose_config(spec, kind, probe.len(), || {
        started
            .engine
            .choose_config(&probe, batches.cold_share(spec.min_run))?;
        Ok(started.engine.info())
    })?;
    let mut header = header(spec, &started, weights, &tokenizer, requests.len());
    header.warmup_batches = batches.warmup.len();
    if header.data.matches_reference == Some(false) && spec.is_logging_rank() {
        eprintln!(
            "warning: {} has sha256 {}, not the suite's {}: results are not comparable with the reference set",
            header.data.path, header.data.sha256, spec.suite.data.sha256
        );
    }
    // Every rank runs every batch (each forward has all-reduces); only rank 0 logs.
    let mut log = open_log(spec, &header)?;
    let mut scored = score_all(spec, &header, started.engine.as_mut(), &batches, &mut log)?;
    let failure = scored.failure.take();
    let summary = finish(
        spec,
        &header,
        started.engine.as_mut(),
        scored,
        failure.as_ref(),
        wall,
    );
    finish_log(log, header, summary, Record::Summary, failure)
}

/// What the scored batches of a run left: their totals, the model FLOPs of the timed batches,
/// what the GPU trackers saw, and the error that ended the run early.
struct Scored {
    totals: BatchTotals,
    model_flops: f64,
    gpu: super::skeleton::GpuFigures,
    /// The engine's compilations inside the timed batches (compiled HF).
    compiles: Option<u64>,
    failure: Option<Error>,
}

/// The run's batches in file order, each with the length it is padded to, and which of them
/// warm up.
struct Batches<'a> {
    list: Vec<(&'a [Request], usize)>,
    warmup: Vec<usize>,
}

impl<'a> Batches<'a> {
    /// `--batch-size` passages a batch, padded by `--pad-multiple` (never past `max_positions`).
    /// The warm-up is the first `--warmup` batches and, with `--pad-multiple` above 1, the
    /// first batch of every shape besides (rows × padded length: the last batch's fewer rows
    /// are a shape of their own, on which torch.compile compiles again).
    fn of(spec: &RunSpec, requests: &'a [Request], max_positions: usize) -> Self {
        let pad = Padding {
            multiple: spec.pad_multiple,
            cap: max_positions,
        };
        let list: Vec<(&[Request], usize)> = requests
            .chunks(spec.batch_size.max(1))
            .map(|b| (b, pad.len(batch_shape(b).longest)))
            .collect();
        let mut warmup = warmup_batches(&shapes(&list), spec.warmup_batches, spec.pad_multiple > 1);
        let rows: Vec<usize> = list.iter().map(|b| b.0.len()).collect();
        warm_short_last(&mut warmup, &rows);
        Self { list, warmup }
    }

    /// The share of the timed batches (all of them, over the passes `min` is known to ask)
    /// that are the first of a shape the warm-up did not meet: only the first pass has them.
    fn cold_share(&self, min: MinRun) -> f64 {
        let shapes = shapes(&self.list);
        let warm: Vec<(usize, usize)> = self.warmup.iter().map(|&i| shapes[i]).collect();
        cold_share(&shapes, &warm) / min.least_passes(shapes.len()) as f64
    }

    /// The first batch of each of the first padded lengths: what HF's probe times.
    fn probe(&self) -> Vec<(&'a [Request], usize)> {
        let lens: Vec<usize> = self.list.iter().map(|b| b.1).collect();
        first_of_each_shape(&lens, PROBE_SHAPES)
            .into_iter()
            .map(|i| self.list[i])
            .collect()
    }
}

/// Untimed warm-up batches, then every batch timed and logged as it finishes, pass after
/// pass until the run's minimums are reached.
fn score_all(
    spec: &RunSpec,
    header: &Header,
    engine: &mut dyn Score,
    batches: &Batches,
    log: &mut RankLog,
) -> Result<Scored> {
    // Untimed warm-up batches: CUDA loads candle's PTX kernels, cuBLAS creates handles and the
    // memory pools grow on first use (and a compiled HF model compiles each new shape); none
    // of that is the model's speed. A failure here (an out-of-memory at a large batch) is
    // recorded like one in the timed batches.
    let mut failure = batches
        .warmup
        .iter()
        .map(|&i| batches.list[i])
        .find_map(|(batch, padded)| engine.score(batch, padded).err());
    // NVML trackers over the timed loop only (warm-up excluded, as for latency).
    let watch = GpuWatch::start(spec.device, header.gpu_index, engine.pid());
    let compiled_before = engine.compiles();
    let shape = ModelShape::of(&spec.model);
    let (mut totals, mut model_flops) = (BatchTotals::default(), 0.);
    let n_passages = batches.list.iter().map(|b| b.0.len()).sum::<usize>();
    let bar = crate::progress::passages(spec.progress && spec.is_logging_rank(), n_passages as u64);
    let mut passes = Passes::new(spec.min_run, batches.list.len());
    while let Some(slot) = passes.next(|stop| group_stops(spec, stop))? {
        if failure.is_some() {
            break;
        }
        if slot.pass > 0 && slot.index == 0 {
            bar.inc_length(n_passages as u64);
        }
        let (batch, padded) = batches.list[slot.index];
        let record = match score_one(engine, slot, batch, padded) {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        passes.timed(record.latency_ms);
        model_flops += batch
            .iter()
            .map(|r| lambada_forward_flops(&shape, r.input.len(), r.target_tokens.len()))
            .sum::<f64>();
        totals.add(&record);
        log.write(&Record::Batch(record))?;
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    Ok(Scored {
        totals,
        model_flops,
        gpu: GpuWatch::stop(watch),
        compiles: engine.compiles().zip(compiled_before).map(|(a, b)| a - b),
        failure,
    })
}

/// (rows, padded length) of each batch: what a compiled engine compiles for.
fn shapes(list: &[(&[Request], usize)]) -> Vec<(usize, usize)> {
    list.iter().map(|(b, len)| (b.len(), *len)).collect()
}

/// Scores the batch of `slot`, padded to `padded_len`, and turns the engine's per-token scores
/// into its log record (its passages on the first pass only: later ones repeat them).
fn score_one(
    engine: &mut dyn Score,
    slot: Slot,
    batch: &[Request],
    padded_len: usize,
) -> Result<BatchRecord> {
    let out = engine.score(batch, padded_len)?;
    let mut passages = passage_results(batch, &out.scores)?;
    if slot.pass > 0 {
        passages.clear();
    }
    Ok(BatchRecord {
        batch: slot.seq,
        pass: slot.pass,
        n_samples: batch.len(),
        n_tokens: batch_shape(batch).n_tokens,
        padded_len,
        latency_ms: out.latency_ms,
        passages,
    })
}

/// The run's summary: totals, memory (engine's), GPU trackers, FLOPs and MFU.
fn finish(
    spec: &RunSpec,
    header: &Header,
    engine: &mut dyn Score,
    scored: Scored,
    failure: Option<&Error>,
    wall: Instant,
) -> Summary {
    let mem = final_memory(engine, failure.is_some());
    let failure = failure.map(|e| message_without_backtrace(&e.to_string()));
    let summary = scored
        .totals
        .summary(failure, wall.elapsed().as_secs_f64(), mem);
    let peak = header
        .gpu_index
        .and_then(|i| header.host.gpu(i))
        .and_then(|g| peak_tflops(&g.name, spec.precision));
    let model_flops = (scored.model_flops > 0.).then_some(scored.model_flops);
    let (achieved, mfu) = mfu(
        model_flops.unwrap_or(0.),
        summary.timed_seconds,
        peak,
        spec.devices(),
    );
    scored.gpu.apply(Summary {
        model_flops,
        achieved_tflop_per_second: achieved,
        peak_tflop_per_second: peak,
        mfu,
        compiles_timed: scored.compiles,
        ..summary
    })
}
