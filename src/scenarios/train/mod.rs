//! The training scenario (causal-LM fine-tuning, run_clm semantics) over either data source:
//! WikiText-2 or Tiny Shakespeare ([`shakespeare`]), as blocks ([`data`]), with the run's
//! schedule ([`prepare`]). [`Training`] opens the engine's [`Train`] capability (fp32-master
//! training in candle, [`crate::train`]; HF transformers + PyTorch in the Python worker;
//! llm.c), which drives the run: the steps the scenario hands out and logs ([`steps`]), the
//! evaluation, the memory; then the summary. Both engines get the same blocks in the same order
//! and the same hyper-parameters; each times its own steps (device synchronized at both ends).

pub mod data;
pub mod prepare;
pub mod shakespeare;
pub mod steps;

use super::skeleton::{base_header, Scenario};
use super::spec::{DpRun, HfParallel, RunSpec, TrainOptions};
use crate::data::sha256_hex;
use crate::engines::registry::{self, EngineArgs, TrainArgs};
use crate::engines::{AfterSteps, EngineKind, Train};
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::flops::{mfu, peak_tflops, train_block_flops, ModelShape};
use crate::log::RankLog;
use crate::metrics::{EvalResult, TrainTotals};
use crate::models::WeightSource;
use crate::record::{DataInfo, DpInfo, Header, Record, TrainInfo, TrainSummary};
use crate::train::{DataParallel, ZeroStage};
use candle_core::Tensor;
use data::TextSplit;
use prepare::{warmup_steps, Prepared};
use std::collections::BTreeMap;
use std::time::Instant;
use steps::Steps;

/// Training with HF Trainer's semantics on `prep`'s blocks ([`prepare::prepare`], made once:
/// every engine of the run gets the same blocks in the same order and the same
/// hyper-parameters). As for LAMBADA, the HF engine reads an HF checkpoint: random weights are
/// written once and, with `--engine both`, candle trains from that same file.
pub struct Training<'a> {
    pub opts: &'a TrainOptions,
    pub prep: &'a Prepared,
}

impl Scenario for Training<'_> {
    type Summary = TrainSummary;
    /// The engine, and whether it runs in this process.
    type Started = (Box<dyn Train>, bool);

    /// Opens the training engine `kind` ([`registry::open_train`]) with the run's blocks and
    /// hyper-parameters, joined to its data-parallel group with `--dp`.
    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<((Box<dyn Train>, bool), Header)> {
        let (opts, prep) = (self.opts, self.prep);
        let dp = spec.dp.as_ref().map(|d| DataParallel {
            rank: d.ctx.group.rank,
            size: d.ctx.group.size,
            reduce: d
                .ctx
                .group
                .reduce
                .clone()
                .expect("a group has an all-reduce"),
            zero: d.zero,
            overlap: d.overlap,
        });
        let train = TrainArgs {
            hyper: &prep.hyper,
            dropout: opts.dropout,
            backward: opts.backward,
            recompute: opts.recompute,
            phase_times: opts.phase_times,
            dp,
            child_parallel: opts.hf_parallel.map(|p| (p.size, p.strategy())),
            batch_size: spec.batch_size,
            block_size: prep.block_size,
            train_blocks: &prep.train_blocks,
            eval_blocks: &prep.eval_blocks,
        };
        let engine = registry::open_train(kind, args, train)?;
        let header = header(spec, opts, prep, engine.as_ref(), args.weights);
        Ok(((engine, registry::entry(kind).in_process), header))
    }

    /// The engine trains every step (only rank 0 logs: every rank takes the same steps, with
    /// the same loss), then, where none failed, gathers each rank's peak (`--dp`), evaluates
    /// (rank 0; every rank under ZeRO-3, whose evaluation gathers the weights block by block)
    /// and saves (`--save`, rank 0); the summary.
    fn run(
        &self,
        spec: &RunSpec,
        (mut engine, in_process): (Box<dyn Train>, bool),
        header: &Header,
        log: &mut RankLog,
        wall: Instant,
    ) -> Result<(TrainSummary, Option<Error>)> {
        let (opts, prep) = (self.opts, self.prep);
        let gather = |mine: u64| match &spec.dp {
            Some(d) => gather_mib(d, mine),
            None => Ok(vec![]),
        };
        let zero3 = spec
            .dp
            .as_ref()
            .is_some_and(|d| d.zero == ZeroStage::Parameters);
        let rank0 = spec.rank() == 0;
        let after = AfterSteps {
            gather_peaks: spec
                .dp
                .as_ref()
                .map(|_| &gather as &dyn Fn(u64) -> Result<Vec<u64>>),
            eval: (rank0 || zero3).then_some((prep.eval_blocks.as_slice(), opts.eval_batch_size)),
            save: opts.save.as_deref().filter(|_| rank0),
            memory_after_failure: in_process,
        };
        let warmup = warmup_steps(spec, prep);
        let bar = spec.progress && rank0;
        let mut steps = Steps::new(spec, opts, prep, log, spec.rank(), warmup, bar);
        let trained = engine.train(&mut steps, &after);
        steps.finish();
        let trained = trained?;
        let totals = steps.totals;
        let eval = EvalResult {
            loss: trained.eval.map_or(f64::NAN, |e| e.0),
            runtime_seconds: trained.eval.map_or(0., |e| e.1),
            n_blocks: prep.eval_blocks.len(),
        };
        let summary = TrainSummary {
            wall_seconds: wall.elapsed().as_secs_f64(),
            peak_memory_bytes: trained.memory.peak_bytes,
            per_rank_peak_memory_bytes: trained.per_rank_peak,
            ..totals.summary(trained.failure.as_ref(), warmup, eval, spec.dp.is_some())
        };
        let summary = with_flop_rates(spec, header, prep, &totals, summary);
        let summary = with_epoch_and_share(header, prep, summary);
        Ok((summary, trained.failure))
    }

    fn record(summary: Box<TrainSummary>) -> Record {
        Record::TrainSummary(summary)
    }
}

fn data_info(split: &TextSplit, n_samples: usize) -> DataInfo {
    DataInfo {
        path: split.origin.clone(),
        sha256: sha256_hex(split.text.as_bytes()),
        n_samples,
        matches_reference: None,
    }
}

/// `bytes` of every rank, in rank order (MiB resolution: the all-reduce carries f32).
fn gather_mib(d: &DpRun, bytes: u64) -> Result<Vec<u64>> {
    let (rank, size) = (d.ctx.group.rank, d.ctx.group.size);
    let mut slots = vec![0f32; size];
    slots[rank] = (bytes as f64 / (1u64 << 20) as f64).round() as f32;
    let reduce = d
        .ctx
        .group
        .reduce
        .as_ref()
        .expect("a group has an all-reduce");
    let sum = reduce.all_reduce_sum(&Tensor::new(slots, &d.ctx.device)?)?;
    Ok(sum
        .to_vec1::<f32>()?
        .into_iter()
        .map(|m| m as u64 * (1 << 20))
        .collect())
}

/// The log header: the shared fields, the engine's, the data's and the schedule's.
fn header(
    spec: &RunSpec,
    opts: &TrainOptions,
    prep: &Prepared,
    engine: &dyn Train,
    weights: &WeightSource,
) -> Header {
    let warmup = warmup_steps(spec, prep);
    let host = EnvReport::collect();
    let info = engine.info();
    let work = warmup_work(engine.name(), &info);
    Header {
        engine: engine.name().into(),
        engine_info: info,
        warmup_batches: warmup,
        seed: Some(spec.seed),
        load_seconds: engine.load_seconds(),
        train: Some(Box::new(TrainInfo {
            note: opts.splits.note.clone(),
            eval_data: data_info(&opts.splits.eval, prep.eval_blocks.len()),
            block_size: prep.block_size,
            n_train_blocks: prep.train_blocks.len(),
            n_eval_blocks: prep.eval_blocks.len(),
            eval_batch_size: opts.eval_batch_size,
            grad_accum: opts.grad_accum,
            epochs: prep.total_steps as f64 / prep.steps_per_epoch as f64,
            max_steps: prep.total_steps,
            dropout: opts.dropout && engine.applies_dropout(),
            drop_last: opts.drop_last,
            hyper: prep.hyper.clone(),
            timing: format!(
                "the first {warmup} optimizer steps are trained but not timed ({}); rates use the other steps' latencies",
                work
            ),
        })),
        dp: match (&spec.dp, opts.hf_parallel) {
            (Some(d), _) => Some(dp_info(spec, opts, d)),
            (None, Some(p)) => Some(hf_dp_info(spec, opts, p)),
            (None, None) => None,
        },
        ..base_header(
            spec,
            weights,
            &prep.tokenizer,
            host,
            data_info(&opts.splits.train, prep.train_blocks.len()),
        )
    }
}

/// What the warm-up steps absorb, by engine.
fn warmup_work(engine: &str, info: &BTreeMap<String, String>) -> &'static str {
    let compiled = info.get("compile").is_some_and(|c| c == "true");
    match engine {
        "hf" if compiled => "torch.compile compiles the model and its backward in the first step; cuBLAS handles, allocator growth",
        "llmc" => "cuBLAS set-up; llm.c leaves its first step out of its own average too",
        _ => "PTX load, cuBLAS handles, allocator growth",
    }
}

fn dp_info(spec: &RunSpec, opts: &TrainOptions, d: &DpRun) -> DpInfo {
    let (n, bs, ga) = (d.ctx.group.size, spec.batch_size, opts.grad_accum);
    DpInfo {
        size: n,
        zero_stage: d.zero.level(),
        overlap: d.overlap,
        backend: d.ctx.backend.clone(),
        launcher: format!("{:?}", d.ctx.world.launcher),
        ranks: d.ctx.peers.clone(),
        global_batch_size: n * bs * ga,
        rules: format!(
            "each optimizer step takes {n} x {ga} micro-batches of {bs} blocks, consecutive in the shuffled order, rank r the r-th {ga} of them (the blocks one process with --grad-accum {} would take); gradients are averaged over ranks, so --lr applies to the global batch of {} blocks unchanged (no scaling rule)",
            n * ga,
            n * bs * ga
        ),
    }
}

/// The HF engine's strategy as the log header's `dp`: torchrun's workers, the same batches as
/// candle's ranks.
fn hf_dp_info(spec: &RunSpec, opts: &TrainOptions, p: HfParallel) -> DpInfo {
    let (n, bs, ga) = (p.size, spec.batch_size, opts.grad_accum);
    DpInfo {
        size: n,
        zero_stage: p.zero.level(),
        overlap: false,
        backend: format!("torch.distributed ({})", p.strategy()),
        launcher: "torchrun".into(),
        ranks: vec![],
        global_batch_size: n * bs * ga,
        rules: format!(
            "the worker's rank r trains on the r-th {ga} of each step's {} micro-batches of {bs} blocks (candle's ranks' blocks); gradients averaged over ranks, --lr unchanged",
            n * ga
        ),
    }
}

/// `summary` with the time an epoch takes at the timed rate and the peak memory's share of
/// the GPU (rank 0's).
fn with_epoch_and_share(header: &Header, prep: &Prepared, summary: TrainSummary) -> TrainSummary {
    let timed = summary.n_steps.saturating_sub(summary.warmup_steps);
    let epoch = (timed > 0 && summary.train_runtime.is_finite())
        .then(|| prep.steps_per_epoch as f64 * summary.train_runtime / timed as f64);
    let gpu_bytes = header
        .gpu_index
        .and_then(|i| header.host.gpu(i))
        .map(|g| g.memory_bytes)
        .filter(|&b| b > 0);
    TrainSummary {
        epoch_seconds: epoch,
        peak_memory_share: gpu_bytes.map(|b| summary.peak_memory_bytes as f64 / b as f64),
        ..summary
    }
}

/// `summary` with the model FLOPs of the timed steps ([`train_block_flops`] per block, every
/// engine counted alike), the FLOP/s achieved over `train_runtime`, and MFU against the run's
/// GPUs, every rank's (none on CPU or an unknown GPU).
fn with_flop_rates(
    spec: &RunSpec,
    header: &Header,
    prep: &Prepared,
    totals: &TrainTotals,
    summary: TrainSummary,
) -> TrainSummary {
    let per_block = train_block_flops(&ModelShape::of(&spec.model), prep.block_size);
    let flops = per_block * totals.timed_samples as f64;
    let peak = header
        .gpu_index
        .and_then(|i| header.host.gpu(i))
        .and_then(|g| peak_tflops(&g.name, spec.precision));
    let (achieved, mfu) = mfu(flops, summary.train_runtime, peak, spec.devices());
    TrainSummary {
        model_flops: (flops > 0.).then_some(flops),
        achieved_tflop_per_second: achieved,
        peak_tflop_per_second: peak,
        mfu,
        ..summary
    }
}
