//! The LAMBADA scoring scenario ([`Lambada`]): the requests, their batches and padding, the
//! same for every engine of the run ([`data`]), and one batch scored into its record; the
//! skeleton warms up, times every batch (again, whole passes, until `--min-time` and
//! `--min-batches`: [`super::passes`]), writes the log and sums it up.

pub mod data;

use super::passes::{MinRun, Slot};
use super::skeleton::{
    base_header, cold_share, first_of_each_shape, gpu_index, probe_status, warm_short_last,
    warmup_batches, Opened, Padding, Timed, PROBE_SHAPES,
};
use super::spec::RunSpec;
use crate::device::DeviceSpec;
use crate::engines::registry::{self, EngineArgs};
use crate::engines::{EngineKind, Request, Score};
use crate::env::{EnvReport, GpuInfo};
use crate::error::{Error, Result};
use crate::flops::{lambada_forward_flops, mfu, peak_tflops, ModelShape};
use crate::metrics::BatchTotals;
use crate::models::WeightSource;
use crate::progress::Status;
use crate::record::{describe_hf_config, BatchRecord, DataInfo, Header, Record, Summary};
use crate::tokenizer::TextTokenizer;
use data::{batch_shape, build_requests, passage_results};
use std::ops::Range;
use std::path::Path;

/// LAMBADA scored as lm-eval `lambada_openai`, timed in passes ([`Timed`]).
pub struct Lambada;

/// A scoring engine's run: the requests, their batches, and what the timed batches add up to
/// besides their records.
pub struct Job {
    requests: Vec<Request>,
    batches: Batches,
    shape: ModelShape,
    /// Model FLOPs of the timed batches.
    model_flops: f64,
    /// The run's GPU peak (None on CPU or an unknown GPU) and how many devices share the work.
    peak: Option<f64>,
    devices: usize,
}

impl Timed for Lambada {
    type Engine = dyn Score;
    type Job = Job;
    type Record = BatchRecord;
    type Totals = BatchTotals;
    type Warm<'a> = (&'a [Request], usize);

    /// Data first (bad data fails before minutes of model loading), then the engine, the
    /// requests cut to its length, the batches and HF's configuration probe.
    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<(Opened<Self>, Header)> {
        let tokenizer =
            TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;
        let mut passages = crate::data::lambada_passages(&spec.data)?;
        if let Some(n) = spec.limit {
            passages.truncate(n);
        }
        let mut started = start(spec, kind, args)?;
        let max_len = max_len(spec, started.engine.as_ref())?;
        let requests = tokenize(args.progress, &tokenizer, &passages, max_len)?;
        let batches = Batches::of(spec, &requests, started.engine.max_positions());
        let probe = batches.probe(&requests);
        let probes = registry::entry(kind).probes;
        let status = probe_status(probes, &spec.hf, args.progress, probe.len());
        started
            .engine
            .choose_config(&probe, batches.cold_share(spec.min_run))?;
        status.done(format!(
            "HF ran {}",
            describe_hf_config(&started.engine.info())
        ));
        let mut header = header(spec, &started, args.weights, &tokenizer, requests.len());
        header.warmup_batches = batches.warmup.len();
        if header.data.matches_reference == Some(false) && spec.is_logging_rank() {
            eprintln!(
                "warning: {} has sha256 {}, not the suite's {}: results are not comparable with the reference set",
                header.data.path, header.data.sha256, spec.suite.data.sha256
            );
        }
        let peak = header
            .gpu_index
            .and_then(|i| header.host.gpu(i))
            .and_then(|g| peak_tflops(&g.name, spec.precision));
        let per_pass = batches.list.len();
        let rows_per_pass = requests.len();
        let job = Job {
            requests,
            batches,
            shape: ModelShape::of(&spec.model),
            model_flops: 0.,
            peak,
            devices: spec.devices(),
        };
        let opened = Opened {
            engine: started.engine,
            job,
            per_pass,
            rows_per_pass,
        };
        Ok((opened, header))
    }

    fn warm_calls<'a>(&self, job: &'a Job) -> Vec<(&'a [Request], usize)> {
        job.batches.warmup.iter().map(|&i| job.batch(i)).collect()
    }

    /// Scores the batch and turns the engine's per-token scores into its log record (its
    /// passages on the first pass only: later ones repeat them).
    fn step(
        &self,
        job: &mut Job,
        engine: &mut (dyn Score + 'static),
        slot: Slot,
    ) -> Result<BatchRecord> {
        let (batch, padded_len) = job.batch(slot.index);
        let out = engine.score(batch, padded_len)?;
        let mut passages = passage_results(batch, &out.scores)?;
        if slot.pass > 0 {
            passages.clear();
        }
        let flops = batch
            .iter()
            .map(|r| lambada_forward_flops(&job.shape, r.input.len(), r.target_tokens.len()))
            .sum::<f64>();
        let record = BatchRecord {
            batch: slot.seq,
            pass: slot.pass,
            n_samples: batch.len(),
            n_tokens: batch_shape(batch).n_tokens,
            padded_len,
            latency_ms: out.latency_ms,
            passages,
        };
        job.model_flops += flops;
        Ok(record)
    }

    fn measured(record: &BatchRecord) -> (f64, usize) {
        (record.latency_ms, record.n_samples)
    }

    fn record(record: BatchRecord) -> Record {
        Record::Batch(record)
    }

    /// The model FLOPs of the timed batches, and MFU against the run's GPUs.
    fn complete(&self, job: &Job, summary: Summary) -> Summary {
        let model_flops = (job.model_flops > 0.).then_some(job.model_flops);
        let (achieved, mfu) = mfu(
            model_flops.unwrap_or(0.),
            summary.timed_seconds,
            job.peak,
            job.devices,
        );
        Summary {
            model_flops,
            achieved_tflop_per_second: achieved,
            peak_tflop_per_second: job.peak,
            mfu,
            ..summary
        }
    }
}

/// An engine that scores, and what is known of its host.
struct Started {
    engine: Box<dyn Score>,
    host: EnvReport,
    cuda_uuid: Option<String>,
}

/// Opens the engine `kind` ([`registry::open_score`]); a child engine's GPU, which NVML sees
/// without a CUDA context here, goes into the host report from its info.
fn start(spec: &RunSpec, kind: EngineKind, args: &EngineArgs) -> Result<Started> {
    let engine = registry::open_score(kind, args)?;
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
/// `progress`: this process shows it.
pub(crate) fn tokenize(
    progress: bool,
    tokenizer: &TextTokenizer,
    passages: &[(usize, String)],
    max_len: usize,
) -> Result<Vec<Request>> {
    let n = passages.len();
    let status = Status::spinner(progress, format!("tokenizing {n} passages"));
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

/// The log header: the shared fields, the engine's, the data's.
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

/// The run's batches in file order, each a range of the requests with the length it is padded
/// to, and which of them warm up.
struct Batches {
    list: Vec<(Range<usize>, usize)>,
    warmup: Vec<usize>,
}

impl Job {
    /// Batch `i` and its padded length.
    fn batch(&self, i: usize) -> (&[Request], usize) {
        let (rows, padded) = &self.batches.list[i];
        (&self.requests[rows.clone()], *padded)
    }
}

impl Batches {
    /// `--batch-size` passages a batch, padded by `--pad-multiple` (never past `max_positions`).
    /// The warm-up is the first `--warmup` batches and, with `--pad-multiple` above 1, the
    /// first batch of every shape besides (rows × padded length: the last batch's fewer rows
    /// are a shape of their own, on which torch.compile compiles again).
    fn of(spec: &RunSpec, requests: &[Request], max_positions: usize) -> Self {
        let pad = Padding {
            multiple: spec.pad_multiple,
            cap: max_positions,
        };
        let size = spec.batch_size.max(1);
        let list: Vec<(Range<usize>, usize)> = (0..requests.len())
            .step_by(size)
            .map(|start| {
                let rows = start..(start + size).min(requests.len());
                let padded = pad.len(batch_shape(&requests[rows.clone()]).longest);
                (rows, padded)
            })
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
    fn probe<'a>(&self, requests: &'a [Request]) -> Vec<(&'a [Request], usize)> {
        let lens: Vec<usize> = self.list.iter().map(|b| b.1).collect();
        first_of_each_shape(&lens, PROBE_SHAPES)
            .into_iter()
            .map(|i| (&requests[self.list[i].0.clone()], self.list[i].1))
            .collect()
    }
}

/// (rows, padded length) of each batch: what a compiled engine compiles for.
fn shapes(list: &[(Range<usize>, usize)]) -> Vec<(usize, usize)> {
    list.iter().map(|(b, len)| (b.len(), *len)).collect()
}
