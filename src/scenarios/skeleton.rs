//! What every scenario does the same way. The run's sequence is here ([`run`]): per engine of
//! the run, its weights and this rank's device, the scenario's start (the engine opened, the
//! data, the header), the log and its header, the scenario's run, the log's last record. A
//! scenario timed in passes ([`Timed`]: scoring, generation) gives only its start and one step:
//! the warm-up, the GPU trackers over the timed loop, the passes, the memory and the summary are
//! here too. Besides: padding, which batches warm up, the log header's shared fields and the
//! log's file name.

use super::passes::{Passes, Slot};
use super::spec::{RunSpec, Workload};
use crate::device::DeviceSpec;
use crate::engines::hf::{HfAttn, HfCompile, HfOptions};
use crate::engines::registry::{self, EngineArgs};
use crate::engines::{memory_or_warning, Engine, EngineKind, WarmUp};
use crate::env::{nvml_index, EnvReport};
use crate::error::{message_without_backtrace, Error, Result};
use crate::log::{RankLog, RunOutcome};
use crate::metrics::{BatchTotals, GenTotals};
use crate::models::{Architecture, ModelSpec, WeightSource};
use crate::progress::Status;
use crate::record::{
    BatchRecord, DataInfo, GenBatchRecord, Header, Record, Summary, TpInfo, SCHEMA_VERSION,
};
use crate::tokenizer::TextTokenizer;
use crate::trackers::{
    EnergyReading, EnergyTracker, GpuActivity, GpuSampler, MemoryReading, NvmlGpu,
};
use candle_core::{Device, Tensor};
use std::time::{Duration, Instant};

/// A scenario as [`run`] runs it, engine after engine: two calls each.
pub trait Scenario {
    /// The log's last record.
    type Summary: Clone;
    /// What [`Scenario::start`] hands to [`Scenario::run`]: the engine and its data.
    type Started;
    /// Opens engine `kind` from `args` (through the registry), makes its data, lets it choose
    /// its configuration; returns it with the log header.
    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<(Self::Started, Header)>;
    /// Runs it, writing each record to `log` as it exists; the summary (`wall`: the run's
    /// start), and the error that ended the run early.
    fn run(
        &self,
        spec: &RunSpec,
        started: Self::Started,
        header: &Header,
        log: &mut RankLog,
        wall: Instant,
    ) -> Result<(Self::Summary, Option<Error>)>;
    /// The summary as the log's last record.
    fn record(summary: Box<Self::Summary>) -> Record;
}

/// Runs `scenario` with each engine `spec` names, in order; one outcome per engine. Where one
/// engine reads an HF checkpoint, random weights are written to one first
/// ([`registry::run_weights`]) and every engine of the run reads that file.
pub fn run<S: Scenario>(spec: &RunSpec, scenario: &S) -> Result<Vec<RunOutcome<S::Summary>>> {
    let weights = registry::run_weights(spec.engine, &engine_args(spec, &spec.weights, None))?;
    let mut outcomes = vec![];
    for &kind in registry::runs(spec.engine) {
        let wall = Instant::now();
        // The device is opened here only for an engine that runs in this process: a child's
        // CUDA context is the child's alone.
        let device = match registry::entry(kind).in_process {
            true => Some(candle_device(spec)?),
            false => None,
        };
        let (started, header) = scenario.start(spec, kind, &engine_args(spec, &weights, device))?;
        // Every rank runs every batch or step (each forward all-reduces); only rank 0 logs.
        let mut log = open_log(spec, &header)?;
        let (summary, failure) = scenario.run(spec, started, &header, &mut log, wall)?;
        log.write(&S::record(Box::new(summary.clone())))?;
        if let Some(e) = failure {
            return Err(e);
        }
        outcomes.push(RunOutcome {
            log_path: log.path(),
            header,
            summary,
        });
    }
    Ok(outcomes)
}

/// What the registry needs to open an engine of `spec` on `weights`; `device`: the
/// in-process engine's.
fn engine_args<'a>(
    spec: &'a RunSpec,
    weights: &'a WeightSource,
    device: Option<Device>,
) -> EngineArgs<'a> {
    EngineArgs {
        model: &spec.model,
        weights,
        precision: spec.precision,
        device: spec.device,
        rank_device: device,
        tp: spec.tp.as_ref().map(|t| &t.group),
        save_weights: spec.save_weights.as_deref(),
        progress: spec.progress && spec.is_logging_rank(),
        seed: spec.seed,
        hf: &spec.hf,
        llmc: &spec.llmc,
        fused: &spec.fused,
    }
}

/// A scenario timed in passes over its batches (scoring, generation). [`run`] runs it as
/// [`TimedRun`]: the warm-up calls untimed, then every batch timed and logged as it finishes,
/// pass after pass until the run's minimums ([`Passes`]), under the GPU trackers; then the
/// engine's memory and the summary.
pub trait Timed {
    /// The capability it runs.
    type Engine: ?Sized + Engine;
    /// Its batches, and what its steps add up besides the records.
    type Job;
    /// One timed batch's log record.
    type Record;
    /// What the records add up to.
    type Totals: PassTotals<Record = Self::Record>;
    /// One warm-up call.
    type Warm<'a>: WarmUp<Self::Engine>
    where
        Self: 'a;
    /// As [`Scenario::start`]: the engine, its batches, the header.
    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<(Opened<Self>, Header)>;
    /// The warm-up calls, in order.
    fn warm_calls<'a>(&self, job: &'a Self::Job) -> Vec<Self::Warm<'a>>;
    /// Runs batch `slot.index` of a pass: its record.
    fn step(
        &self,
        job: &mut Self::Job,
        engine: &mut Self::Engine,
        slot: Slot,
    ) -> Result<Self::Record>;
    /// A record's latency (what the minimum time counts) and its rows (the progress bar's).
    fn measured(record: &Self::Record) -> (f64, usize);
    /// The record as a log record.
    fn record(record: Self::Record) -> Record;
    /// `summary` with what the scenario adds from its job (FLOPs, KV cache).
    fn complete(&self, job: &Self::Job, summary: Summary) -> Summary;
}

/// What [`Timed::start`] opened: the engine, the job, and how many batches and rows a pass
/// has.
pub struct Opened<T: Timed + ?Sized> {
    pub engine: Box<T::Engine>,
    pub job: T::Job,
    pub per_pass: usize,
    pub rows_per_pass: usize,
}

/// Records added up: [`BatchTotals`] (scoring), [`GenTotals`] (generation).
pub trait PassTotals: Default {
    type Record;
    fn add(&mut self, record: &Self::Record);
    fn summary(&self, failure: Option<String>, wall_seconds: f64, mem: MemoryReading) -> Summary;
}

impl PassTotals for BatchTotals {
    type Record = BatchRecord;
    fn add(&mut self, record: &BatchRecord) {
        BatchTotals::add(self, record);
    }
    fn summary(&self, failure: Option<String>, wall_seconds: f64, mem: MemoryReading) -> Summary {
        BatchTotals::summary(self, failure, wall_seconds, mem)
    }
}

impl PassTotals for GenTotals {
    type Record = GenBatchRecord;
    fn add(&mut self, record: &GenBatchRecord) {
        GenTotals::add(self, record);
    }
    /// The KV cache's bytes are the engine's: [`Timed::complete`] adds them.
    fn summary(&self, failure: Option<String>, wall_seconds: f64, mem: MemoryReading) -> Summary {
        GenTotals::summary(self, failure, wall_seconds, mem, None)
    }
}

/// A [`Timed`] scenario as [`run`] runs it.
pub struct TimedRun<T>(pub T);

impl<T: Timed> Scenario for TimedRun<T> {
    type Summary = Summary;
    type Started = Opened<T>;

    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<(Opened<T>, Header)> {
        self.0.start(spec, kind, args)
    }

    fn run(
        &self,
        spec: &RunSpec,
        opened: Opened<T>,
        header: &Header,
        log: &mut RankLog,
        wall: Instant,
    ) -> Result<(Summary, Option<Error>)> {
        let Opened {
            mut engine,
            mut job,
            per_pass,
            rows_per_pass,
        } = opened;
        let engine = engine.as_mut();
        // Untimed warm-up calls: CUDA loads candle's PTX kernels, cuBLAS creates handles and the
        // memory pools grow on first use (and a compiled HF model compiles each new shape);
        // none of that is the model's speed. A failure here (an out-of-memory at a large batch)
        // is recorded like one in the timed batches.
        let mut failure = self
            .0
            .warm_calls(&job)
            .iter()
            .find_map(|call| call.warm_up(engine).err());
        // NVML trackers over the timed loop only (warm-up excluded, as for latency).
        let watch = GpuWatch::start(spec.device, header.gpu_index, engine.pid());
        let compiled_before = engine.compiles();
        let mut totals = T::Totals::default();
        let logging = spec.progress && spec.is_logging_rank();
        let bar = crate::progress::passages(logging, rows_per_pass as u64);
        let mut passes = Passes::new(spec.min_run, per_pass);
        let agree = group_stop(spec);
        while let Some(slot) = passes.next(&agree)? {
            if failure.is_some() {
                break;
            }
            if slot.pass > 0 && slot.index == 0 {
                bar.inc_length(rows_per_pass as u64);
            }
            let record = match self.0.step(&mut job, engine, slot) {
                Ok(r) => r,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let (latency_ms, rows) = T::measured(&record);
            passes.timed(latency_ms);
            totals.add(&record);
            log.write(&T::record(record))?;
            bar.inc(rows as u64);
        }
        bar.finish_and_clear();
        let gpu = GpuWatch::stop(watch);
        let compiles = engine.compiles().zip(compiled_before).map(|(a, b)| a - b);
        let mem = match failure.is_some() {
            true => MemoryReading::default(),
            false => memory_or_warning(engine.finish()),
        };
        let message = failure
            .as_ref()
            .map(|e| message_without_backtrace(&e.to_string()));
        let summary = totals.summary(message, wall.elapsed().as_secs_f64(), mem);
        let summary = gpu.apply(Summary {
            compiles_timed: compiles,
            ..self.0.complete(&job, summary)
        });
        Ok((summary, failure))
    }

    fn record(summary: Box<Summary>) -> Record {
        Record::Summary(summary)
    }
}

/// The spinner over an engine's `choose_config`, shown where `progress` and the engine
/// `probes` (the HF worker timing its configurations, `--hf-attn best`, `--hf-compile best`,
/// on `n_probe` probe batches); the scenario says what it chose as it ends.
pub fn probe_status(probes: bool, hf: &HfOptions, progress: bool, n_probe: usize) -> Status {
    let timed = probes && (hf.attn == HfAttn::Best || hf.compile == HfCompile::Best);
    let batches = if n_probe == 1 { "batch" } else { "batches" };
    let msg = format!(
        "HF: timing each configuration (attention, torch.compile) on {n_probe} probe {batches}, cold then warm"
    );
    Status::spinner(timed && progress, msg)
}

/// Longest sequence `model` takes: GPT-2's learned positions, BLOOM's lm-eval default (ALiBi
/// has no limit of its own).
pub fn max_positions(model: &ModelSpec) -> usize {
    match &model.arch {
        Architecture::Gpt2(c) => c.n_positions,
        Architecture::Bloom(_) => crate::models::bloom::Config::MAX_POSITIONS,
    }
}

/// How far a batch is padded (`--pad-multiple`): every row to its longest, rounded up to a
/// multiple of `multiple` so that a compiled engine sees a few shapes (one per bucket of
/// `multiple` positions), never past `cap` (what the model takes). Padding is masked: no real
/// token sees it, so results do not depend on it (tested).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Padding {
    pub multiple: usize,
    pub cap: usize,
}

impl Padding {
    /// The padded length of a batch whose longest row has `longest` tokens.
    pub fn len(&self, longest: usize) -> usize {
        let m = self.multiple.max(1);
        (longest.div_ceil(m) * m).min(self.cap).max(longest)
    }
}

/// Which batches warm up, by index: the first `n`, and with `every_shape` also the first batch
/// of each shape (`shapes[i]`) that those leave out, so that no timed batch is the first of its
/// shape (where a compiled engine compiles and sdpa sets itself up for the shape).
pub fn warmup_batches<K: PartialEq>(shapes: &[K], n: usize, every_shape: bool) -> Vec<usize> {
    let mut warm: Vec<usize> = (0..n.min(shapes.len())).collect();
    if every_shape {
        for i in first_of_each_shape(shapes, usize::MAX) {
            if !warm.iter().any(|&w| shapes[w] == shapes[i]) {
                warm.push(i);
            }
        }
    }
    warm
}

/// Adds the last batch to `warm` when no other batch has its row count (a partial batch):
/// torch.compile compiles again for it (it specialises a batch of one row), so it must not be
/// met first in the timed loop. `rows` holds each batch's row count, in order.
pub fn warm_short_last(warm: &mut Vec<usize>, rows: &[usize]) {
    if let Some((&last, rest)) = rows.split_last() {
        let i = rows.len() - 1;
        if !rest.is_empty() && !rest.contains(&last) && !warm.contains(&i) {
            warm.push(i);
        }
    }
}

/// The first batch of each of the first `cap` distinct shapes, in order (what `--hf-attn best`
/// times its candidates on).
pub fn first_of_each_shape<K: PartialEq>(shapes: &[K], cap: usize) -> Vec<usize> {
    let mut firsts: Vec<usize> = vec![];
    for (i, s) in shapes.iter().enumerate() {
        if firsts.len() == cap {
            break;
        }
        if !firsts.iter().any(|&f| shapes[f] == *s) {
            firsts.push(i);
        }
    }
    firsts
}

/// Padded lengths HF's probe times its candidates on (the first batch of each): the first two
/// pay one-time set-up, the later ones show what a new shape costs.
pub const PROBE_SHAPES: usize = 4;

/// The share of the timed batches (`shapes` of every timed batch, in order) that are the first
/// of a shape none of the `warm` shapes is: where a compiled engine compiles and sdpa sets
/// itself up inside the timed loop.
pub fn cold_share<K: PartialEq>(shapes: &[K], warm: &[K]) -> f64 {
    let mut met: Vec<&K> = warm.iter().collect();
    let mut cold = 0;
    for s in shapes {
        if !met.contains(&s) {
            met.push(s);
            cold += 1;
        }
    }
    cold as f64 / shapes.len().max(1) as f64
}

/// The device candle runs on: this rank's (tensor or data parallel), else `--device`.
fn candle_device(spec: &RunSpec) -> Result<Device> {
    match (&spec.tp, &spec.dp) {
        (Some(t), _) => Ok(t.device.clone()),
        (_, Some(d)) => Ok(d.ctx.device.clone()),
        _ => spec.device.open(),
    }
}

/// The header fields every run shares: tool, commit, time, command line, model, precision,
/// host, the GPU (its index on this host, by ordinal) and the random weights' seed. Each
/// scenario adds its engine, data and suite fields with struct update syntax (and its own GPU
/// index or seed where it knows better: the engine's CUDA uuid, training's data seed).
pub fn base_header(
    spec: &RunSpec,
    weights: &WeightSource,
    tokenizer: &TextTokenizer,
    host: EnvReport,
    data: DataInfo,
) -> Header {
    // Scoring and generation time passes over their batches; training times its steps,
    // serving its requests.
    let timed_loop = !matches!(spec.workload, Workload::Train(_) | Workload::Serve(_));
    let gpu = gpu_index(spec.device, None, &host);
    Header {
        schema_version: SCHEMA_VERSION,
        tool: "transformer-bench".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: crate::GIT_COMMIT.into(),
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
        gpu_index: gpu,
        batch_size: spec.batch_size,
        warmup_batches: spec.warmup_batches,
        min_time_s: timed_loop.then_some(spec.min_run.seconds),
        min_batches: timed_loop.then_some(spec.min_run.batches),
        seed: match spec.weights {
            WeightSource::Random { seed } => Some(seed),
            WeightSource::Dir(_) => None,
        },
        limit: None,
        data,
        load_seconds: 0.,
        seq_len: None,
        repeat: spec.repeat,
        train: None,
        pad_multiple: timed_loop.then_some(spec.pad_multiple),
        tp: spec.tp.as_ref().map(|t| TpInfo {
            size: t.group.size,
            backend: t.backend.clone(),
            launcher: format!("{:?}", t.world.launcher),
            ranks: t.peers.clone(),
        }),
        dp: None,
        generation: None,
        serving: None,
        auto: spec.auto.clone(),
    }
}

/// A run log's file stem: `SUITE_MODEL_ENGINE_DTYPE_bsN_DEVICE[_tpN]_TIME` (ENGINE as
/// [`Header::engine_label`] names it: `hf-compile` for compiled HF).
pub fn log_stem(h: &Header) -> String {
    format!(
        "{}_{}_{}_{}_bs{}_{}{}_{}",
        h.suite,
        // An HF hub id (ORG/NAME) names no folder.
        h.model.name.replace('/', "--"),
        h.engine_label(),
        h.dtype,
        h.batch_size,
        h.device.replace(':', ""),
        h.tp.as_ref()
            .map(|t| format!("_tp{}", t.size))
            .unwrap_or_default(),
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
    )
}

/// Opens the run's log (rank 0 only; the other ranks run the same loop and write nothing) and
/// writes its header.
fn open_log(spec: &RunSpec, header: &Header) -> Result<RankLog> {
    let mut log = RankLog::create(spec.is_logging_rank(), &spec.log_dir, &log_stem(header))?;
    log.write(&Record::Header(Box::new(header.clone())))?;
    Ok(log)
}

/// NVML index of the run's GPU (`cuda:N`, told apart by UUID under `CUDA_VISIBLE_DEVICES`);
/// None on CPU or where NVML does not list it.
pub fn gpu_index(device: DeviceSpec, cuda_uuid: Option<&str>, host: &EnvReport) -> Option<usize> {
    let DeviceSpec::Cuda(ordinal) = device else {
        return None;
    };
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    nvml_index(ordinal, cuda_uuid, visible.as_deref(), &host.gpus)
        .filter(|&i| host.gpu(i).is_some())
}

/// Whether the run's group stops its timed loop ([`Passes::next`]): rank 0's answer,
/// all-reduced to every rank of a tensor-parallel run (each forward all-reduces, so every rank
/// must run the same batches); alone, its own.
fn group_stop(spec: &RunSpec) -> impl Fn(bool) -> Result<bool> + '_ {
    move |stop| {
        let Some((tp, reduce)) = spec
            .tp
            .as_ref()
            .and_then(|t| Some((t, t.group.reduce.as_ref()?)))
        else {
            return Ok(stop);
        };
        let mine = if tp.group.rank == 0 && stop { 1f32 } else { 0. };
        let sum = reduce.all_reduce_sum(&Tensor::new(&[mine], &tp.device)?)?;
        Ok(sum.to_vec1::<f32>()?[0] > 0.5)
    }
}

/// NVML sampler and energy counter over a timed loop, on the run's GPU.
pub struct GpuWatch {
    sampler: GpuSampler,
    energy: Option<EnergyTracker>,
}

impl GpuWatch {
    /// Starts watching NVML GPU `gpu_index` and process `pid`; None on CPU. A GPU NVML cannot
    /// read costs these figures (with a warning), not the run.
    pub fn start(device: DeviceSpec, gpu_index: Option<usize>, pid: u32) -> Option<Self> {
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
        Some(Self {
            sampler: GpuSampler::start(gpu, Duration::from_millis(10)),
            energy,
        })
    }

    /// Stops both trackers (before the engine finishes: its memory query is not timed).
    pub fn stop(watch: Option<Self>) -> GpuFigures {
        match watch {
            Some(w) => GpuFigures {
                activity: Some(w.sampler.stop()),
                energy: w.energy.and_then(|e| {
                    e.stop()
                        .inspect_err(|e| eprintln!("warning: energy tracking failed: {e}"))
                        .ok()
                }),
            },
            None => GpuFigures::default(),
        }
    }
}

/// What [`GpuWatch`] saw.
#[derive(Default)]
pub struct GpuFigures {
    activity: Option<GpuActivity>,
    energy: Option<EnergyReading>,
}

impl GpuFigures {
    /// `summary` with these figures (energy per sample over every timed sample).
    pub fn apply(self, summary: Summary) -> Summary {
        let act = self.activity.unwrap_or_default();
        let energy = self.energy;
        let n_samples = summary.timed_samples.unwrap_or(summary.n_samples);
        Summary {
            nvml_peak_process_memory_bytes: act.peak_process_memory_bytes,
            nvml_peak_device_memory_used_bytes: act.peak_device_memory_used_bytes,
            sm_clock_mhz_median: act.sm_clock_mhz_median,
            gpu_utilization_percent_median: act.utilization_percent_median,
            power_watts_mean: act.power_watts_mean,
            gpu_samples: self.activity.map(|a| a.n_samples),
            energy_joules: energy.map(|e| e.joules),
            energy_seconds: energy.map(|e| e.seconds),
            joules_per_sample: energy
                .filter(|_| n_samples > 0)
                .map(|e| e.joules / n_samples as f64),
            ..summary
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Padding;

    #[test]
    fn padding_rounds_up_to_the_multiple_within_the_cap() {
        let p = |multiple, cap| Padding { multiple, cap };
        assert_eq!(p(1, 1024).len(37), 37, "multiple 1: the longest row");
        assert_eq!(p(64, 1024).len(37), 64);
        assert_eq!(p(64, 1024).len(64), 64);
        assert_eq!(p(64, 1024).len(65), 128);
        // Never past what the model takes, never shorter than the longest row.
        assert_eq!(p(64, 1000).len(990), 1000);
        assert_eq!(p(64, 10).len(12), 12);
    }

    #[test]
    fn the_warm_up_covers_every_shape_when_asked() {
        let shapes = [64, 64, 128, 64, 192, 128, 256];
        assert_eq!(super::warmup_batches(&shapes, 2, false), [0, 1]);
        assert_eq!(super::warmup_batches(&shapes, 2, true), [0, 1, 2, 4, 6]);
        assert_eq!(super::warmup_batches(&shapes, 0, true), [0, 2, 4, 6]);
        assert_eq!(super::warmup_batches(&shapes[..1], 3, false), [0]);
    }

    #[test]
    fn probes_are_the_first_batch_of_the_first_shapes() {
        let shapes = [64, 64, 128, 64, 192, 128, 256];
        assert_eq!(super::first_of_each_shape(&shapes, 3), [0, 2, 4]);
        let mut warm = vec![0, 1];
        super::warm_short_last(&mut warm, &[16, 16, 16, 1]);
        assert_eq!(warm, [0, 1, 3], "a partial last batch warms up");
        super::warm_short_last(&mut warm, &[16, 16, 16, 1]);
        assert_eq!(warm, [0, 1, 3], "once");
        let mut whole = vec![0];
        super::warm_short_last(&mut whole, &[16, 16, 16]);
        super::warm_short_last(&mut whole, &[5]);
        assert_eq!(
            whole,
            [0],
            "whole batches, or one batch only: nothing added"
        );
        assert_eq!(super::first_of_each_shape(&shapes[..2], 3), [0]);
    }
}
