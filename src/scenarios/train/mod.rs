//! The training scenario (causal-LM fine-tuning, run_clm semantics) end to end, over either data
//! source: WikiText-2 or Tiny Shakespeare ([`shakespeare`]), as blocks ([`data`]); training through the [`Train`] capability (fp32-master training in candle,
//! [`crate::train`], or HF transformers + PyTorch in the Python worker), evaluation, the JSONL
//! log, the summary. Both engines get the same blocks in the same order and the same
//! hyper-parameters; each times its own steps (device synchronized at both ends).

pub mod data;
pub mod shakespeare;

use super::skeleton::{
    base_header, candle_device, engine_args, engine_runs, final_memory, finish_log, gpu_index,
    max_positions, open_log,
};
use super::spec::{DpRun, HfParallel, RunSpec, TrainOptions};
use crate::data::sha256_hex;
use crate::device::DeviceSpec;
use crate::engines::registry::{self, TrainArgs};
use crate::engines::{EngineKind, TimedStep, Train};
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::flops::{mfu, peak_tflops, train_block_flops, ModelShape};
use crate::log::{RankLog, RunOutcome};
use crate::metrics::{EvalResult, TrainTotals};
use crate::models::WeightSource;
use crate::record::{DataInfo, DpInfo, Header, Hyper, Record, StepRecord, TrainInfo, TrainSummary};
use crate::tokenizer::TextTokenizer;
use crate::train::{DataParallel, ZeroStage};
use candle_core::Tensor;
use data::{blocks, Corpus, TextSplit};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use std::time::Instant;

/// Trains with each engine `spec` names, in order; one outcome per engine. As for LAMBADA, the
/// HF engine reads an HF checkpoint: random weights are written once and, with `--engine
/// both`, candle trains from that same file.
pub fn run(spec: &RunSpec, opts: &TrainOptions) -> Result<Vec<RunOutcome<TrainSummary>>> {
    let prep = prepare(spec, opts)?;
    if spec.is_logging_rank() {
        eprintln!("{}", opts.splits.note);
    }
    engine_runs(spec)?
        .iter()
        .map(|(kind, weights)| train_with(spec, opts, &prep, *kind, weights))
        .collect()
}

fn data_info(split: &TextSplit, n_samples: usize) -> DataInfo {
    DataInfo {
        path: split.origin.clone(),
        sha256: sha256_hex(split.text.as_bytes()),
        n_samples,
        matches_reference: None,
    }
}

/// Data and schedule of a training run, the same for every engine.
struct Prepared {
    tokenizer: TextTokenizer,
    block_size: usize,
    train_blocks: Vec<Vec<u32>>,
    eval_blocks: Vec<Vec<u32>>,
    micro_per_epoch: usize,
    steps_per_epoch: usize,
    total_steps: usize,
    hyper: Hyper,
}

fn prepare(spec: &RunSpec, opts: &TrainOptions) -> Result<Prepared> {
    let tokenizer =
        TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;
    let max_pos = max_positions(&spec.model);
    let block_size = opts.block_size.unwrap_or(max_pos.min(1024));
    if block_size < 2 || block_size > max_pos {
        return Err(Error::Config(format!(
            "--block-size {block_size} must be in 2..={max_pos} (the model's positions)"
        )));
    }
    let (train_blocks, eval_blocks) = match opts.splits.corpus {
        Corpus::RunClm => (
            blocks(&opts.splits.train.text, &tokenizer, block_size)?,
            blocks(&opts.splits.eval.text, &tokenizer, block_size)?,
        ),
        Corpus::Dialogue => shakespeare::blocks(&opts.splits.train.text, &tokenizer, block_size)?,
    };
    if train_blocks.is_empty() || eval_blocks.is_empty() {
        return Err(Error::Config(format!(
            "{} or {} has fewer tokens than one block of {block_size}: lower --block-size",
            opts.splits.train.origin, opts.splits.eval.origin
        )));
    }
    let micro_per_epoch = if opts.drop_last {
        train_blocks.len() / spec.batch_size
    } else {
        train_blocks.len().div_ceil(spec.batch_size)
    };
    if micro_per_epoch == 0 {
        return Err(Error::Config(format!(
            "{} has {} blocks of {block_size}, fewer than one batch of {} with --drop-last (on with --hf-compile): lower --batch-size",
            opts.splits.train.origin,
            train_blocks.len(),
            spec.batch_size
        )));
    }
    // Micro-batches per optimizer step over all data-parallel ranks.
    let global_accum = opts.grad_accum * ranks(spec, opts);
    let steps_per_epoch = (micro_per_epoch / global_accum).max(1);
    let total_steps = opts
        .max_steps
        .unwrap_or_else(|| (opts.epochs * steps_per_epoch as f64).ceil() as usize)
        .max(1);
    let hyper = Hyper {
        learning_rate: opts.learning_rate,
        lr_warmup_steps: opts.lr_warmup_steps,
        total_steps,
        grad_accum: opts.grad_accum,
        ..Hyper::default()
    };
    Ok(Prepared {
        tokenizer,
        block_size,
        train_blocks,
        eval_blocks,
        micro_per_epoch,
        steps_per_epoch,
        total_steps,
        hyper,
    })
}

/// Data-parallel ranks of the run: candle's group, or the HF engine's torchrun workers.
fn ranks(spec: &RunSpec, opts: &TrainOptions) -> usize {
    spec.dp_size().max(opts.hf_parallel.map_or(1, |p| p.size))
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

/// Opens the training engine `kind` ([`registry::open_train`]) with the run's blocks and
/// hyper-parameters, joined to its data-parallel group with `--dp`.
fn start(
    spec: &RunSpec,
    opts: &TrainOptions,
    prep: &Prepared,
    kind: EngineKind,
    weights: &WeightSource,
) -> Result<Box<dyn Train>> {
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
    let open = || candle_device(spec);
    registry::open_train(kind, &engine_args(spec, weights, &open), train)
}

/// Warm-up steps (trained, not timed): the suite's, leaving at least one timed step.
fn warmup_steps(spec: &RunSpec, prep: &Prepared) -> usize {
    spec.warmup_batches.min(prep.total_steps.saturating_sub(1))
}

fn header(
    spec: &RunSpec,
    opts: &TrainOptions,
    prep: &Prepared,
    engine: &dyn Train,
    weights: &WeightSource,
) -> Header {
    let warmup = warmup_steps(spec, prep);
    let host = EnvReport::collect();
    Header {
        gpu_index: match spec.device {
            DeviceSpec::Cuda(_) => gpu_index(spec.device, None, &host),
            DeviceSpec::Cpu => None,
        },
        engine: engine.name().into(),
        engine_info: engine.info(),
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
            dropout: opts.dropout,
            drop_last: opts.drop_last,
            hyper: prep.hyper.clone(),
            timing: format!(
                "the first {warmup} optimizer steps are trained but not timed ({}); rates use the other steps' latencies",
                warmup_work(engine)
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
fn warmup_work(engine: &dyn Train) -> &'static str {
    let compiled = engine.info().get("compile").is_some_and(|c| c == "true");
    match engine.name() {
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

/// Micro-batches over epochs, each epoch reshuffled (seeded; HF's RandomSampler draws another
/// permutation), the last partial batch kept (HF's dataloader_drop_last=False) unless
/// `drop_last`. Every engine of a run starts from the same seed: the same blocks in the same
/// order.
struct MicroBatches {
    rng: rand_chacha::ChaCha8Rng,
    order: Vec<usize>,
    cursor: usize,
    n_blocks: usize,
    batch_size: usize,
    drop_last: bool,
}

impl MicroBatches {
    fn new(seed: u64, n_blocks: usize, batch_size: usize, drop_last: bool) -> Self {
        Self {
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            order: vec![],
            cursor: 0,
            n_blocks,
            batch_size,
            drop_last,
        }
    }

    /// Block indices of the next micro-batch.
    fn next(&mut self) -> Vec<usize> {
        let left = self.order.len() - self.cursor;
        if left == 0 || (self.drop_last && left < self.batch_size) {
            self.order = (0..self.n_blocks).collect();
            self.order.shuffle(&mut self.rng);
            self.cursor = 0;
        }
        let end = (self.cursor + self.batch_size).min(self.order.len());
        let idx = self.order[self.cursor..end].to_vec();
        self.cursor = end;
        idx
    }
}

fn train_with(
    spec: &RunSpec,
    opts: &TrainOptions,
    prep: &Prepared,
    kind: EngineKind,
    weights: &WeightSource,
) -> Result<RunOutcome<TrainSummary>> {
    let wall = Instant::now();
    let mut engine = start(spec, opts, prep, kind, weights)?;
    let header = header(spec, opts, prep, engine.as_ref(), weights);
    // Only rank 0 logs: every rank takes the same steps, with the same loss.
    let mut log = open_log(spec, &header)?;
    let (totals, mut failure) = train_steps(spec, opts, prep, engine.as_mut(), &mut log)?;

    // Each rank's peak over the training steps, gathered to every rank (the last collective:
    // only rank 0 evaluates and logs after it).
    let mut per_rank_peak = None;
    if let (Some(d), None) = (&spec.dp, &failure) {
        let mine = engine.finish().map(|m| m.peak_bytes).unwrap_or(0);
        per_rank_peak = Some(gather_mib(d, mine)?);
    }
    let mut eval = EvalResult {
        loss: f64::NAN,
        runtime_seconds: 0.,
        n_blocks: prep.eval_blocks.len(),
    };
    // ZeRO-3's evaluation gathers the weights block by block: every rank takes part.
    let zero3 = spec
        .dp
        .as_ref()
        .is_some_and(|d| d.zero == ZeroStage::Parameters);
    if failure.is_none() && (spec.rank() == 0 || zero3) {
        match engine.eval(&prep.eval_blocks, opts.eval_batch_size) {
            Ok((l, s)) => (eval.loss, eval.runtime_seconds) = (l, s),
            Err(e) => failure = Some(e),
        }
    }
    if let (None, Some(dir), 0) = (&failure, &opts.save, spec.rank()) {
        engine.save(dir)?;
        eprintln!(
            "saved trained weights to {} (config.json + model.safetensors, fp32)",
            dir.display()
        );
    }
    // A dead worker has no memory to report.
    let mem = final_memory(
        engine.as_mut(),
        failure.is_some() && !registry::entry(kind).in_process,
    );
    let warmup = warmup_steps(spec, prep);
    let summary = TrainSummary {
        wall_seconds: wall.elapsed().as_secs_f64(),
        peak_memory_bytes: mem.peak_bytes,
        per_rank_peak_memory_bytes: per_rank_peak,
        ..totals.summary(failure.as_ref(), warmup, eval, spec.dp.is_some())
    };
    let summary = with_flop_rates(spec, &header, prep, &totals, summary);
    let summary = with_epoch_and_share(&header, prep, summary);
    finish_log(log, header, summary, Record::TrainSummary, failure)
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

/// Every optimizer step, each logged as it finishes; stops at the first failing step and
/// returns its error beside the totals of the steps before it.
fn train_steps(
    spec: &RunSpec,
    opts: &TrainOptions,
    prep: &Prepared,
    engine: &mut dyn Train,
    log: &mut RankLog,
) -> Result<(TrainTotals, Option<Error>)> {
    let (dp_rank, dp_n, ga) = (spec.rank(), ranks(spec, opts), opts.grad_accum);
    // The HF engine's torchrun workers take the whole step's micro-batches and share them out.
    let (mine_from, mine_to) = match opts.hf_parallel {
        Some(_) => (0, ga * dp_n),
        None => (dp_rank * ga, (dp_rank + 1) * ga),
    };
    let warmup = warmup_steps(spec, prep);
    let mut micro = MicroBatches::new(
        spec.seed,
        prep.train_blocks.len(),
        spec.batch_size,
        opts.drop_last,
    );
    let bar = crate::progress::steps(spec.progress && dp_rank == 0, prep.total_steps as u64);
    let mut totals = TrainTotals::default();
    let mut micro_done = 0usize;
    for step in 0..prep.total_steps {
        // Every rank draws the whole step's micro-batches (the same seeded order) and trains on
        // its share: rank r takes micro-batches r·ga .. (r+1)·ga.
        let ids: Vec<Vec<usize>> = (0..ga * dp_n).map(|_| micro.next()).collect();
        let n_samples: usize = ids.iter().map(Vec::len).sum();
        let mine: Vec<Vec<&[u32]>> = ids[mine_from..mine_to]
            .iter()
            .map(|b| b.iter().map(|&i| prep.train_blocks[i].as_slice()).collect())
            .collect();
        let TimedStep {
            outcome: out,
            latency_ms,
        } = match engine.step(&mine) {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                return Ok((totals, Some(e)));
            }
        };
        micro_done += ga * dp_n;
        let n_tokens = n_samples * prep.block_size;
        let record = StepRecord {
            step: step + 1,
            epoch: micro_done as f64 / prep.micro_per_epoch as f64,
            loss: out.loss,
            learning_rate: out.lr,
            grad_norm: out.grad_norm,
            latency_ms,
            n_samples,
            n_tokens,
            warmup: step < warmup,
            skipped: out.skipped,
            loss_scale: out.loss_scale,
            phases_ms: out.phases_ms,
            comm_ms: out.comm_ms,
            host_ms: out.host_ms,
        };
        totals.add(&record);
        log.write(&Record::Step(record))?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok((totals, None))
}

#[cfg(test)]
mod tests {
    use super::MicroBatches;

    /// 10 blocks in batches of 4: an epoch is 4, 4, 2 with the ragged batch kept, and 4, 4
    /// with it dropped (each epoch a fresh permutation of every block either way).
    #[test]
    fn drop_last_skips_each_epochs_partial_batch() {
        let sizes = |drop_last| {
            let mut m = MicroBatches::new(0, 10, 4, drop_last);
            (0..6).map(|_| m.next().len()).collect::<Vec<_>>()
        };
        assert_eq!(sizes(false), [4, 4, 2, 4, 4, 2]);
        assert_eq!(sizes(true), [4, 4, 4, 4, 4, 4]);
        let mut m = MicroBatches::new(0, 10, 4, true);
        let epoch: Vec<usize> = (0..2).flat_map(|_| m.next()).collect();
        let mut seen = epoch.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 8, "no block twice within an epoch: {epoch:?}");
    }
}
