//! Runs a training suite (WikiText-2 fine-tuning, run_clm semantics) end to end: data blocks,
//! fp32-master training in candle ([`crate::train`]), evaluation, the JSONL log, the summary.

use crate::data::sha256_hex;
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::metrics::{per_second, Distribution};
use crate::models::weights::save_checkpoint;
use crate::record::{
    DataInfo, Header, Record, RunLog, StepRecord, TrainInfo, TrainSummary, SCHEMA_VERSION,
};
use crate::runner::{RunSpec, GIT_COMMIT};
use crate::suites::wikitext2::{blocks, Split, Splits};
use crate::tokenizer::TextTokenizer;
use crate::trackers::{peak_rss_bytes, LatencyTracker, MemoryTracker};
use crate::train::{Hyper, Trainer};
use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::PathBuf;
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

/// (B, T) u32 on `device` from equal-length blocks.
fn batch_tensor(blocks: &[&Vec<u32>], device: &Device) -> Result<Tensor> {
    let t = blocks[0].len();
    let flat: Vec<u32> = blocks.iter().flat_map(|b| b.iter().copied()).collect();
    Ok(Tensor::from_vec(flat, (blocks.len(), t), device)?)
}

pub fn run_train(spec: &RunSpec, opts: &TrainOptions) -> Result<TrainOutcome> {
    let wall = Instant::now();
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
    let bs = spec.batch_size;
    let micro_per_epoch = train_blocks.len().div_ceil(bs);
    let steps_per_epoch = (micro_per_epoch / opts.grad_accum).max(1);
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

    let device = spec.device.open()?;
    spec.precision.apply_matmul_mode(&device);
    let memory = MemoryTracker::start(&device)
        .inspect_err(|e| eprintln!("warning: memory tracking unavailable: {e}"))
        .ok();
    let load = Instant::now();
    let mut trainer = Trainer::new(
        &spec.model,
        &spec.weights,
        spec.precision.dtype(),
        &device,
        hyper.clone(),
        opts.dropout,
    )?;
    crate::device::synchronize(&device)?;
    let load_seconds = load.elapsed().as_secs_f64();

    let warmup = spec.warmup_batches.min(total_steps.saturating_sub(1));
    let header = Header {
        schema_version: SCHEMA_VERSION,
        tool: "transformer-bench".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: GIT_COMMIT.into(),
        time_utc: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command_line: spec.command_line.clone(),
        engine: "candle".into(),
        engine_info: [("candle".to_string(), "0.11.1".to_string())].into(),
        suite: spec.suite.name.clone(),
        model: spec.model.info(&spec.weights, &spec.weights),
        tokenizer: tokenizer.describe().into(),
        dtype: spec.precision.to_string(),
        device: spec.device.to_string(),
        host: EnvReport::collect(),
        gpu_index: None,
        seq_len: None,
        repeat: spec.repeat,
        batch_size: bs,
        warmup_batches: warmup,
        seed: Some(spec.seed),
        limit: None,
        data: data_info(&opts.splits.train, train_blocks.len()),
        load_seconds,
        train: Some(Box::new(TrainInfo {
            note: opts.splits.note.clone(),
            eval_data: data_info(&opts.splits.eval, eval_blocks.len()),
            block_size,
            n_train_blocks: train_blocks.len(),
            n_eval_blocks: eval_blocks.len(),
            eval_batch_size: opts.eval_batch_size,
            grad_accum: opts.grad_accum,
            epochs: total_steps as f64 / steps_per_epoch as f64,
            max_steps: total_steps,
            dropout: opts.dropout,
            hyper,
            timing: format!(
                "the first {warmup} optimizer steps are trained but not timed (PTX load, cuBLAS handles, allocator growth); rates use the other steps' latencies"
            ),
        })),
    };
    eprintln!("{}", opts.splits.note);
    let stem = format!(
        "{}_{}_candle_{}_bs{}_{}_{}",
        header.suite,
        header.model.name,
        header.dtype,
        bs,
        header.device.replace(':', ""),
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
    );
    let mut log = RunLog::create(&spec.log_dir, &stem)?;
    log.write(&Record::Header(Box::new(header.clone())))?;

    // Micro-batches over epochs, each epoch reshuffled (seeded; HF's RandomSampler draws
    // another permutation), the last partial batch kept (HF's dataloader_drop_last=False).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(spec.seed);
    let mut order: Vec<usize> = vec![];
    let mut cursor = 0usize;
    let mut epoch = 0usize;
    let mut next_micro = |order: &mut Vec<usize>, cursor: &mut usize| -> Vec<usize> {
        if *cursor >= order.len() {
            *order = (0..train_blocks.len()).collect();
            order.shuffle(&mut rng);
            *cursor = 0;
            epoch += 1;
        }
        let end = (*cursor + bs).min(order.len());
        let idx = order[*cursor..end].to_vec();
        *cursor = end;
        idx
    };

    let bar = crate::runner::progress_bar(spec.progress, total_steps as u64);
    let (mut losses, mut timed_ms) = (vec![], vec![]);
    let (mut timed_samples, mut timed_tokens) = (0usize, 0usize);
    let mut failure = None;
    let mut lat = LatencyTracker::new(&device);
    let mut micro_done = 0usize;
    for step in 0..total_steps {
        let ids: Vec<Vec<usize>> = (0..opts.grad_accum)
            .map(|_| next_micro(&mut order, &mut cursor))
            .collect();
        let n_samples: usize = ids.iter().map(Vec::len).sum();
        let result = lat.start().and_then(|_| {
            let micro = ids
                .iter()
                .map(|b| {
                    let rows: Vec<&Vec<u32>> = b.iter().map(|&i| &train_blocks[i]).collect();
                    batch_tensor(&rows, &device)
                })
                .collect::<Result<Vec<_>>>()?;
            let out = trainer.step(&micro)?;
            Ok((out, lat.stop_ms()?))
        });
        let (out, ms) = match result {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        micro_done += opts.grad_accum;
        let is_warmup = step < warmup;
        losses.push(out.loss);
        if !is_warmup {
            timed_ms.push(ms);
            timed_samples += n_samples;
            timed_tokens += n_samples * block_size;
        }
        log.write(&Record::Step(StepRecord {
            step: step + 1,
            epoch: micro_done as f64 / micro_per_epoch as f64,
            loss: out.loss,
            learning_rate: out.lr,
            grad_norm: out.grad_norm,
            latency_ms: ms,
            n_samples,
            n_tokens: n_samples * block_size,
            warmup: is_warmup,
            skipped: out.skipped,
            loss_scale: out.loss_scale,
        }))?;
        bar.inc(1);
    }
    bar.finish_and_clear();

    let (mut eval_loss, mut eval_runtime) = (f64::NAN, 0.);
    if failure.is_none() {
        let eval = (|| -> Result<(f64, f64)> {
            let batches = eval_blocks
                .chunks(opts.eval_batch_size)
                .map(|c| batch_tensor(&c.iter().collect::<Vec<_>>(), &device))
                .collect::<Result<Vec<_>>>()?;
            lat.start()?;
            let loss = trainer.eval_loss(&batches)?;
            Ok((loss, lat.stop_ms()? / 1e3))
        })();
        match eval {
            Ok((l, s)) => (eval_loss, eval_runtime) = (l, s),
            Err(e) => failure = Some(e),
        }
    }
    if let (None, Some(dir)) = (&failure, &opts.save) {
        save_checkpoint(
            dir,
            &spec.model.hf_config(DType::F32),
            trainer.named_params(),
        )?;
        eprintln!(
            "saved trained weights to {} (config.json + model.safetensors, fp32)",
            dir.display()
        );
    }
    let mem = memory.and_then(|m| m.read().ok()).unwrap_or_default();
    let runtime = timed_ms.iter().sum::<f64>() / 1e3;
    let d = Distribution::of(&timed_ms);
    let summary = TrainSummary {
        status: if failure.is_some() { "error" } else { "ok" }.into(),
        error: failure.as_ref().map(|e| e.to_string()),
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
    };
    log.write(&Record::TrainSummary(Box::new(summary.clone())))?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(TrainOutcome {
        log_path: log.path().to_path_buf(),
        header,
        summary,
    })
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
