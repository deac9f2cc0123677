//! Runs a training suite (WikiText-2 fine-tuning, run_clm semantics) end to end: data blocks,
//! training through a [`TrainEngine`] (fp32-master training in candle, [`crate::train`], or HF
//! transformers + PyTorch in the Python worker), evaluation, the JSONL log, the summary. Both
//! engines get the same blocks in the same order and the same hyper-parameters; each times its
//! own steps (device synchronized at both ends).

use crate::data::sha256_hex;
use crate::engines::hf::HfEngine;
use crate::engines::EngineKind;
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::metrics::{per_second, Distribution};
use crate::models::weights::save_checkpoint;
use crate::models::WeightSource;
use crate::record::DpInfo;
use crate::record::{
    DataInfo, Header, PhaseMs, RankLog, Record, StepRecord, TrainInfo, TrainSummary,
};
use crate::runner::{base_header, hf_checkpoint, log_stem, RunSpec};
use crate::suites::wikitext2::{blocks, Split, Splits};
use crate::tokenizer::TextTokenizer;
use crate::trackers::{peak_rss_bytes, LatencyTracker, MemoryReading, MemoryTracker};
use crate::train::DataParallel;
use crate::train::{Hyper, StepOutcome, Trainer};
use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Training flags, resolved against the suite file.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub splits: Splits,
    /// None: min(1024, n_positions), as run_clm.
    pub block_size: Option<usize>,
    pub epochs: f64,
    /// Overrides `epochs` (HF `max_steps`).
    pub max_steps: Option<usize>,
    pub grad_accum: usize,
    pub learning_rate: f64,
    pub lr_warmup_steps: usize,
    pub eval_batch_size: usize,
    pub dropout: bool,
    /// Synchronize between forward, backward and update and log each one's time.
    pub phase_times: bool,
    /// Write the trained weights (fp32 masters) as an HF checkpoint here.
    pub save: Option<PathBuf>,
}

pub struct TrainOutcome {
    pub log_path: PathBuf,
    pub header: Header,
    pub summary: TrainSummary,
}

fn data_info(split: &Split, n_samples: usize) -> DataInfo {
    DataInfo {
        path: split.origin.clone(),
        sha256: sha256_hex(split.text.as_bytes()),
        n_samples,
        matches_reference: None,
    }
}

/// One optimizer step as an engine measured it.
pub struct StepOut {
    pub outcome: StepOutcome,
    /// Device synchronized at both ends: ids to the device, forward, backward, clipping,
    /// optimizer update.
    pub latency_ms: f64,
}

/// What the training loop needs from an engine. Blocks are token ids of equal length.
pub trait TrainEngine {
    fn name(&self) -> &'static str;
    fn info(&self) -> BTreeMap<String, String>;
    fn load_seconds(&self) -> f64;
    /// One optimizer step over `micro_batches` (each a list of blocks; gradient accumulation
    /// when more than one).
    fn step(&mut self, micro_batches: &[Vec<&[u32]>]) -> Result<StepOut>;
    /// Mean next-token loss per block over `blocks` in batches of `batch_size` (no dropout, no
    /// gradients), and its runtime in seconds.
    fn eval(&mut self, blocks: &[Vec<u32>], batch_size: usize) -> Result<(f64, f64)>;
    /// Writes the trained fp32 weights as an HF checkpoint.
    fn save(&self, dir: &Path) -> Result<()>;
    /// Peak memory; ends the engine.
    fn finish(&mut self) -> Result<MemoryReading>;
}

/// The candle trainer ([`Trainer`]) on an opened device.
struct CandleTrain {
    trainer: Trainer,
    spec: crate::models::ModelSpec,
    device: Device,
    memory: Option<MemoryTracker>,
    load_seconds: f64,
}

impl CandleTrain {
    fn start(spec: &RunSpec, weights: &WeightSource, hyper: &Hyper, dropout: bool) -> Result<Self> {
        let device = match &spec.dp {
            Some(d) => d.ctx.device.clone(),
            None => spec.device.open()?,
        };
        spec.precision.apply_matmul_mode(&device);
        crate::kernels::set_dropout_seed(spec.seed);
        let memory = MemoryTracker::start(&device)
            .inspect_err(|e| eprintln!("warning: memory tracking unavailable: {e}"))
            .ok();
        let load = Instant::now();
        let mut trainer = Trainer::new(
            &spec.model,
            weights,
            spec.precision.dtype(),
            &device,
            hyper.clone(),
            dropout,
        )?;
        if let Some(d) = &spec.dp {
            trainer.set_data_parallel(DataParallel {
                rank: d.ctx.group.rank,
                size: d.ctx.group.size,
                reduce: d
                    .ctx
                    .group
                    .reduce
                    .clone()
                    .expect("a group has an all-reduce"),
                zero1: d.zero1,
            })?;
        }
        crate::device::synchronize(&device)?;
        Ok(Self {
            trainer,
            spec: spec.model.clone(),
            device,
            memory,
            load_seconds: load.elapsed().as_secs_f64(),
        })
    }
}

impl TrainEngine for CandleTrain {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn info(&self) -> BTreeMap<String, String> {
        let mut info = BTreeMap::from([("candle".to_string(), "0.11.1".to_string())]);
        if self.device.is_cuda() {
            info.insert("fused".into(), crate::kernels::describe());
        }
        info
    }

    fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    fn step(&mut self, micro_batches: &[Vec<&[u32]>]) -> Result<StepOut> {
        let _profiled = crate::profile::window(&self.device);
        let mut lat = LatencyTracker::new(&self.device);
        lat.start()?;
        let micro = micro_batches
            .iter()
            .map(|b| batch_tensor(b, &self.device))
            .collect::<Result<Vec<_>>>()?;
        let outcome = self.trainer.step(&micro)?;
        Ok(StepOut {
            outcome,
            latency_ms: lat.stop_ms()?,
        })
    }

    fn eval(&mut self, blocks: &[Vec<u32>], batch_size: usize) -> Result<(f64, f64)> {
        let batches = blocks
            .chunks(batch_size.max(1))
            .map(|c| {
                let rows: Vec<&[u32]> = c.iter().map(Vec::as_slice).collect();
                batch_tensor(&rows, &self.device)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut lat = LatencyTracker::new(&self.device);
        lat.start()?;
        let loss = self.trainer.eval_loss(&batches)?;
        Ok((loss, lat.stop_ms()? / 1e3))
    }

    fn save(&self, dir: &Path) -> Result<()> {
        save_checkpoint(
            dir,
            &self.spec.hf_config(DType::F32),
            self.trainer.named_params(),
        )
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        match &self.memory {
            Some(m) => m.read(),
            None => Ok(MemoryReading::default()),
        }
    }
}

/// HF transformers + PyTorch: the worker's `train_step` / `eval` ops.
struct HfTrain(HfEngine);

impl TrainEngine for HfTrain {
    fn name(&self) -> &'static str {
        "hf"
    }

    fn info(&self) -> BTreeMap<String, String> {
        crate::engines::Engine::info(&self.0)
    }

    fn load_seconds(&self) -> f64 {
        crate::engines::Engine::load_seconds(&self.0)
    }

    fn step(&mut self, micro_batches: &[Vec<&[u32]>]) -> Result<StepOut> {
        let v = self
            .0
            .request(&json!({ "op": "train_step", "micro_batches": micro_batches }))?;
        let num = |k: &str| -> Result<f64> {
            v[k].as_f64()
                .ok_or_else(|| Error::Engine(format!("HF worker train_step reply has no '{k}'")))
        };
        Ok(StepOut {
            outcome: StepOutcome {
                comm_ms: None,
                loss: num("loss")?,
                // null: a non-finite norm (fp16 overflow) that JSON cannot carry.
                grad_norm: v["grad_norm"].as_f64().unwrap_or(f64::INFINITY),
                lr: num("learning_rate")?,
                skipped: v["skipped"].as_bool().unwrap_or(false),
                loss_scale: v["loss_scale"].as_f64(),
                phases_ms: serde_json::from_value(v["phases_ms"].clone()).ok(),
            },
            latency_ms: num("latency_ms")?,
        })
    }

    fn eval(&mut self, blocks: &[Vec<u32>], batch_size: usize) -> Result<(f64, f64)> {
        let v = self
            .0
            .request(&json!({ "op": "eval", "blocks": blocks, "batch_size": batch_size }))?;
        match (v["eval_loss"].as_f64(), v["runtime_ms"].as_f64()) {
            (Some(loss), Some(ms)) => Ok((loss, ms / 1e3)),
            _ => Err(Error::Engine(
                "HF worker eval reply has no eval_loss / runtime_ms".into(),
            )),
        }
    }

    fn save(&self, _dir: &Path) -> Result<()> {
        Err(Error::Unsupported(
            "--save writes the candle engine's weights".into(),
        ))
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        crate::engines::Engine::finish(&mut self.0)
    }
}

/// (B, T) u32 on `device` from equal-length blocks.
fn batch_tensor(blocks: &[&[u32]], device: &Device) -> Result<Tensor> {
    let t = blocks[0].len();
    let flat: Vec<u32> = blocks.iter().flat_map(|b| b.iter().copied()).collect();
    Ok(Tensor::from_vec(flat, (blocks.len(), t), device)?)
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
    let max_pos = match &spec.model.arch {
        crate::models::Architecture::Gpt2(c) => c.n_positions,
        crate::models::Architecture::Bloom(_) => crate::models::bloom::Config::MAX_POSITIONS,
    };
    let block_size = opts.block_size.unwrap_or(max_pos.min(1024));
    if block_size < 2 || block_size > max_pos {
        return Err(Error::Config(format!(
            "--block-size {block_size} must be in 2..={max_pos} (the model's positions)"
        )));
    }
    let train_blocks = blocks(&opts.splits.train.text, &tokenizer, block_size)?;
    let eval_blocks = blocks(&opts.splits.eval.text, &tokenizer, block_size)?;
    if train_blocks.is_empty() || eval_blocks.is_empty() {
        return Err(Error::Config(format!(
            "{} or {} has fewer tokens than one block of {block_size}: lower --block-size",
            opts.splits.train.origin, opts.splits.eval.origin
        )));
    }
    let micro_per_epoch = train_blocks.len().div_ceil(spec.batch_size);
    // Micro-batches per optimizer step over all data-parallel ranks.
    let global_accum = opts.grad_accum * dp_size(spec);
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

/// `bytes` of every rank, in rank order (MiB resolution: the all-reduce carries f32).
fn gather_mib(d: &crate::runner::DpRun, bytes: u64) -> Result<Vec<u64>> {
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

/// Ranks of the data-parallel group (1 without `--dp`).
fn dp_size(spec: &RunSpec) -> usize {
    spec.dp.as_ref().map_or(1, |d| d.ctx.group.size)
}

/// Trains with each engine `spec` names, in order; one outcome per engine. As for LAMBADA
/// ([`crate::runner::run`]), the HF engine reads an HF checkpoint: random weights are written
/// once and, with `--engine both`, candle trains from that same file.
pub fn run_train(spec: &RunSpec, opts: &TrainOptions) -> Result<Vec<TrainOutcome>> {
    let prep = prepare(spec, opts)?;
    if spec.is_logging_rank() {
        eprintln!("{}", opts.splits.note);
    }
    match spec.engine {
        EngineKind::Candle => Ok(vec![train_with(
            spec,
            opts,
            &prep,
            EngineKind::Candle,
            &spec.weights,
        )?]),
        kind => {
            HfEngine::preflight(&spec.hf)?;
            let weights = WeightSource::Dir(hf_checkpoint(spec)?);
            let mut out = vec![];
            if kind == EngineKind::Both {
                out.push(train_with(spec, opts, &prep, EngineKind::Candle, &weights)?);
            }
            out.push(train_with(spec, opts, &prep, EngineKind::Hf, &weights)?);
            Ok(out)
        }
    }
}

fn train_with(
    spec: &RunSpec,
    opts: &TrainOptions,
    prep: &Prepared,
    kind: EngineKind,
    weights: &WeightSource,
) -> Result<TrainOutcome> {
    let wall = Instant::now();
    let (train_blocks, eval_blocks) = (&prep.train_blocks, &prep.eval_blocks);
    let (block_size, total_steps) = (prep.block_size, prep.total_steps);
    let bs = spec.batch_size;
    let mut engine: Box<dyn TrainEngine> = match (kind, weights) {
        (EngineKind::Hf, WeightSource::Dir(dir)) => {
            let mut train = serde_json::to_value(&prep.hyper).expect("hyper serializes");
            train["dropout"] = Value::Bool(opts.dropout);
            train["seed"] = json!(spec.seed);
            train["phase_times"] = Value::Bool(opts.phase_times);
            Box::new(HfTrain(HfEngine::start_training(
                &spec.hf,
                dir,
                spec.precision,
                spec.device,
                train,
            )?))
        }
        (EngineKind::Hf, WeightSource::Random { .. }) => {
            return Err(Error::Config(
                "the HF engine loads a checkpoint: random weights are written first".into(),
            ))
        }
        _ => {
            let mut candle = CandleTrain::start(spec, weights, &prep.hyper, opts.dropout)?;
            candle.trainer.phase_times = opts.phase_times;
            Box::new(candle)
        }
    };

    let warmup = spec.warmup_batches.min(total_steps.saturating_sub(1));
    let header = Header {
        engine: engine.name().into(),
        engine_info: engine.info(),
        warmup_batches: warmup,
        seed: Some(spec.seed),
        load_seconds: engine.load_seconds(),
        train: Some(Box::new(TrainInfo {
            note: opts.splits.note.clone(),
            eval_data: data_info(&opts.splits.eval, eval_blocks.len()),
            block_size,
            n_train_blocks: train_blocks.len(),
            n_eval_blocks: eval_blocks.len(),
            eval_batch_size: opts.eval_batch_size,
            grad_accum: opts.grad_accum,
            epochs: total_steps as f64 / prep.steps_per_epoch as f64,
            max_steps: total_steps,
            dropout: opts.dropout,
            hyper: prep.hyper.clone(),
            timing: format!(
                "the first {warmup} optimizer steps are trained but not timed (PTX load, cuBLAS handles, allocator growth); rates use the other steps' latencies"
            ),
        })),
        ..base_header(
            spec,
            weights,
            &prep.tokenizer,
            EnvReport::collect(),
            data_info(&opts.splits.train, train_blocks.len()),
        )
    };
    let (dp_rank, dp_n) = spec
        .dp
        .as_ref()
        .map_or((0, 1), |d| (d.ctx.group.rank, d.ctx.group.size));
    let header = Header {
        dp: spec.dp.as_ref().map(|d| DpInfo {
            size: dp_n,
            zero_stage: d.zero1 as u8,
            backend: d.ctx.backend.clone(),
            launcher: format!("{:?}", d.ctx.world.launcher),
            ranks: d.ctx.peers.clone(),
            global_batch_size: dp_n * bs * opts.grad_accum,
            rules: format!(
                "each optimizer step takes {dp_n} x {} micro-batches of {bs} blocks, consecutive in the shuffled order, rank r the r-th {} of them (the blocks one process with --grad-accum {} would take); gradients are averaged over ranks, so --lr applies to the global batch of {} blocks unchanged (no scaling rule)",
                opts.grad_accum,
                opts.grad_accum,
                dp_n * opts.grad_accum,
                dp_n * bs * opts.grad_accum
            ),
        }),
        ..header
    };
    let stem = log_stem(&header);
    // Only rank 0 logs: every rank takes the same steps, with the same loss.
    let mut log = RankLog::create(spec.is_logging_rank(), &spec.log_dir, &stem)?;
    log.write(&Record::Header(Box::new(header.clone())))?;

    // Micro-batches over epochs, each epoch reshuffled (seeded; HF's RandomSampler draws
    // another permutation), the last partial batch kept (HF's dataloader_drop_last=False).
    // Every engine of a run starts from the same seed: the same blocks in the same order.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(spec.seed);
    let mut order: Vec<usize> = vec![];
    let mut cursor = 0usize;
    let mut next_micro = |order: &mut Vec<usize>, cursor: &mut usize| -> Vec<usize> {
        if *cursor >= order.len() {
            *order = (0..train_blocks.len()).collect();
            order.shuffle(&mut rng);
            *cursor = 0;
        }
        let end = (*cursor + bs).min(order.len());
        let idx = order[*cursor..end].to_vec();
        *cursor = end;
        idx
    };

    let bar = crate::runner::progress_bar(spec.progress && dp_rank == 0, total_steps as u64);
    let mut comm_ms_total = 0.;
    let (mut losses, mut timed_ms) = (vec![], vec![]);
    let (mut timed_samples, mut timed_tokens) = (0usize, 0usize);
    let mut failure = None;
    let mut micro_done = 0usize;
    let mut phases: Vec<PhaseMs> = vec![];
    for step in 0..total_steps {
        // Every rank draws the whole step's micro-batches (the same seeded order) and trains on
        // its share: rank r takes micro-batches r·ga .. (r+1)·ga.
        let ids: Vec<Vec<usize>> = (0..opts.grad_accum * dp_n)
            .map(|_| next_micro(&mut order, &mut cursor))
            .collect();
        let n_samples: usize = ids.iter().map(Vec::len).sum();
        let mine = &ids[dp_rank * opts.grad_accum..(dp_rank + 1) * opts.grad_accum];
        let micro: Vec<Vec<&[u32]>> = mine
            .iter()
            .map(|b| b.iter().map(|&i| train_blocks[i].as_slice()).collect())
            .collect();
        let StepOut {
            outcome: out,
            latency_ms: ms,
        } = match engine.step(&micro) {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        micro_done += opts.grad_accum * dp_n;
        let is_warmup = step < warmup;
        losses.push(out.loss);
        if !is_warmup {
            timed_ms.push(ms);
            timed_samples += n_samples;
            timed_tokens += n_samples * block_size;
        }
        if !is_warmup {
            comm_ms_total += out.comm_ms.unwrap_or(0.);
        }
        log.write(&Record::Step(StepRecord {
            step: step + 1,
            epoch: micro_done as f64 / prep.micro_per_epoch as f64,
            loss: out.loss,
            learning_rate: out.lr,
            grad_norm: out.grad_norm,
            latency_ms: ms,
            n_samples,
            n_tokens: n_samples * block_size,
            warmup: is_warmup,
            skipped: out.skipped,
            loss_scale: out.loss_scale,
            phases_ms: out.phases_ms,
            comm_ms: out.comm_ms,
        }))?;
        if !is_warmup {
            phases.extend(out.phases_ms);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();

    // Each rank's peak over the training steps, gathered to every rank (the last collective:
    // only rank 0 evaluates and logs after it).
    let mut per_rank_peak = None;
    if let (Some(d), None) = (&spec.dp, &failure) {
        let mine = engine.finish().map(|m| m.peak_bytes).unwrap_or(0);
        per_rank_peak = Some(gather_mib(d, mine)?);
    }
    let (mut eval_loss, mut eval_runtime) = (f64::NAN, 0.);
    if failure.is_none() && dp_rank == 0 {
        match engine.eval(eval_blocks, opts.eval_batch_size) {
            Ok((l, s)) => (eval_loss, eval_runtime) = (l, s),
            Err(e) => failure = Some(e),
        }
    }
    if let (None, Some(dir), 0) = (&failure, &opts.save, dp_rank) {
        engine.save(dir)?;
        eprintln!(
            "saved trained weights to {} (config.json + model.safetensors, fp32)",
            dir.display()
        );
    }
    // A dead worker has no memory to report.
    let mem = if failure.is_some() && kind == EngineKind::Hf {
        MemoryReading::default()
    } else {
        engine.finish().unwrap_or_else(|e| {
            eprintln!("warning: memory tracking failed: {e}");
            MemoryReading::default()
        })
    };
    let runtime = timed_ms.iter().sum::<f64>() / 1e3;
    let d = Distribution::of(&timed_ms);
    let summary = TrainSummary {
        // `oom` or `error` by the message's words, as for LAMBADA runs.
        status: failure
            .as_ref()
            .map_or("ok", |e| crate::error::failure_status(&e.to_string()))
            .into(),
        error: failure
            .as_ref()
            .map(|e| crate::error::message_without_backtrace(&e.to_string())),
        n_steps: losses.len(),
        warmup_steps: warmup.min(losses.len()),
        train_runtime: runtime,
        train_samples_per_second: per_second(timed_samples as f64, runtime),
        train_steps_per_second: per_second(timed_ms.len() as f64, runtime),
        tokens_per_second: per_second(timed_tokens as f64, runtime),
        train_loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
        first_loss: losses.first().copied().unwrap_or(f64::NAN),
        last_loss: losses.last().copied().unwrap_or(f64::NAN),
        eval_loss,
        eval_runtime,
        eval_samples_per_second: per_second(eval_blocks.len() as f64, eval_runtime),
        perplexity: eval_loss.exp(),
        step_latency_ms_p50: d.p50,
        step_latency_ms_p90: d.p90,
        step_latency_ms_mean: d.mean,
        wall_seconds: wall.elapsed().as_secs_f64(),
        peak_memory_bytes: mem.peak_bytes,
        peak_host_memory_bytes: peak_rss_bytes(),
        comm_share: spec
            .dp
            .as_ref()
            .map(|_| comm_ms_total / (runtime * 1e3).max(f64::MIN_POSITIVE)),
        per_rank_peak_memory_bytes: per_rank_peak,
        phases_ms_p50: (!phases.is_empty()).then(|| {
            let p50 = |f: fn(&PhaseMs) -> f64| {
                Distribution::of(&phases.iter().map(f).collect::<Vec<_>>()).p50
            };
            PhaseMs {
                forward: p50(|p| p.forward),
                backward: p50(|p| p.backward),
                update: p50(|p| p.update),
            }
        }),
    };
    log.write(&Record::TrainSummary(Box::new(summary.clone())))?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(TrainOutcome {
        log_path: log.path(),
        header,
        summary,
    })
}

/// The candle-vs-HF table of `--suite wikitext2 --engine both`, and whether the engines agree.
/// Rates and memory are compared as ratios. The check: with dropout off, the first step's loss
/// (same weights, same first batch, nothing trained yet) within 1e-3 relative in fp32/tf32
/// (the LAMBADA tolerance; summation order and TF32 matmuls differ between the engines) and
/// 1e-2 in bf16/fp16 (torch autocast picks each op's precision, candle casts its weights per
/// step: the two round at different points). With dropout on the masks are random per
/// engine, so no step's loss is comparable and nothing is checked.
pub fn train_side_by_side(candle: &TrainOutcome, hf: &TrainOutcome) -> (String, bool) {
    let (c, h) = (&candle.summary, &hf.summary);
    let mib = |b: u64| b as f64 / (1024. * 1024.);
    let mut t = format!(
        "\n{:<26} {:>14} {:>14} {:>12}\n",
        "candle vs hf", "candle", "hf", "candle/hf"
    );
    let mut row = |name: &str, a: f64, b: f64, prec: usize| {
        t += &format!("{name:<26} {a:>14.prec$} {b:>14.prec$} {:>12.3}\n", a / b);
    };
    row(
        "train_samples_per_second",
        c.train_samples_per_second,
        h.train_samples_per_second,
        3,
    );
    row(
        "step latency p50 ms",
        c.step_latency_ms_p50,
        h.step_latency_ms_p50,
        3,
    );
    row("first step loss", c.first_loss, h.first_loss, 6);
    row("train_loss", c.train_loss, h.train_loss, 4);
    row("eval_loss", c.eval_loss, h.eval_loss, 4);
    row("perplexity", c.perplexity, h.perplexity, 3);
    row(
        "peak memory MiB",
        mib(c.peak_memory_bytes),
        mib(h.peak_memory_bytes),
        1,
    );
    let dropout = candle.header.train.as_ref().is_none_or(|t| t.dropout);
    if dropout {
        t += "first-step loss not checked: dropout is on (each engine draws its own masks, so losses differ step by step); --no-dropout checks it\n";
        return (t, true);
    }
    let full = matches!(candle.header.dtype.as_str(), "fp32" | "tf32");
    let tol = if full { 1e-3 } else { 1e-2 };
    let rel = (c.first_loss - h.first_loss).abs() / h.first_loss.abs();
    let agree = rel <= tol;
    t += &format!(
        "first-step loss {} (rel. diff {rel:.2e}, tolerance {tol:.0e}; dropout off, same weights and batch)\n",
        if agree { "agrees" } else { "DISAGREES" }
    );
    (t, agree)
}

/// The printed summary of a training run.
pub fn train_table(h: &Header, s: &TrainSummary, log_path: &std::path::Path) -> String {
    let t = h.train.as_ref();
    let mut out = format!(
        "{} | {} | {} ({:.2}M params, weights {}) | {} | {} | batch {} x accum {} | block {}\n",
        h.engine,
        h.suite,
        h.model.name,
        h.model.n_parameters as f64 / 1e6,
        h.model.weights,
        h.dtype,
        h.device,
        h.batch_size,
        t.map_or(1, |t| t.grad_accum),
        t.map_or(0, |t| t.block_size),
    );
    if let Some(t) = t {
        out += &format!("  data                      {}\n", t.note);
    }
    if let Some(d) = &h.dp {
        out += &format!(
            "  data parallel             {} ranks over {}, ZeRO-{}, global batch {} blocks; figures from rank 0\n",
            d.size, d.backend, d.zero_stage, d.global_batch_size
        );
    }
    out += &format!(
        "  steps                     {} ({} warm-up, not timed)\n",
        s.n_steps, s.warmup_steps
    );
    out += &format!(
        "  train_loss                {:.4} (first {:.4}, last {:.4})\n",
        s.train_loss, s.first_loss, s.last_loss
    );
    out += &format!("  eval_loss                 {:.4}\n", s.eval_loss);
    out += &format!("  perplexity                {:.3}\n", s.perplexity);
    out += &format!(
        "  train_samples_per_second  {:.3}\n",
        s.train_samples_per_second
    );
    out += &format!(
        "  train_steps_per_second    {:.3}\n",
        s.train_steps_per_second
    );
    out += &format!("  tokens/s                  {:.1}\n", s.tokens_per_second);
    out += &format!(
        "  step latency ms           p50 {:.3}  p90 {:.3}\n",
        s.step_latency_ms_p50, s.step_latency_ms_p90
    );
    if let Some(c) = s.comm_share {
        out += &format!(
            "  all-reduce share          {:.1}% of the timed steps\n",
            c * 100.
        );
    }
    if let Some(m) = &s.per_rank_peak_memory_bytes {
        let gib: Vec<String> = m
            .iter()
            .map(|b| format!("{:.2}", *b as f64 / (1u64 << 30) as f64))
            .collect();
        out += &format!("  peak memory by rank       {} GiB\n", gib.join(" / "));
    }
    if let Some(p) = &s.phases_ms_p50 {
        out += &format!(
            "  phases p50 ms             forward {:.3}  backward {:.3}  update {:.3}\n",
            p.forward, p.backward, p.update
        );
    }
    out += &format!(
        "  train_runtime / eval_runtime  {:.3} s / {:.3} s\n",
        s.train_runtime, s.eval_runtime
    );
    out += &format!(
        "  peak memory               {:.1} MiB\n",
        s.peak_memory_bytes as f64 / 1048576.
    );
    out += &format!("log: {}\n", log_path.display());
    out
}
