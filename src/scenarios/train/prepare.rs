//! A training run's data and schedule, made once for every engine of the run: the blocks of
//! either data source, the steps, the hyper-parameters ([`prepare`]).

use super::data::{blocks, Corpus};
use super::shakespeare;
use crate::error::{Error, Result};
use crate::record::Hyper;
use crate::scenarios::skeleton::max_positions;
use crate::scenarios::spec::{RunSpec, TrainOptions};
use crate::tokenizer::TextTokenizer;

/// Data and schedule of a training run, the same for every engine.
pub struct Prepared {
    pub tokenizer: TextTokenizer,
    pub block_size: usize,
    pub train_blocks: Vec<Vec<u32>>,
    pub eval_blocks: Vec<Vec<u32>>,
    pub micro_per_epoch: usize,
    pub steps_per_epoch: usize,
    pub total_steps: usize,
    pub hyper: Hyper,
    /// Data-parallel ranks of the run: candle's group, or the HF engine's torchrun workers.
    pub ranks: usize,
}

/// The run's blocks and schedule; says where they come from (rank 0).
pub fn prepare(spec: &RunSpec, opts: &TrainOptions) -> Result<Prepared> {
    let prep = schedule(spec, opts)?;
    if spec.is_logging_rank() {
        eprintln!("{}", opts.splits.note);
    }
    Ok(prep)
}

/// The blocks and the schedule.
fn schedule(spec: &RunSpec, opts: &TrainOptions) -> Result<Prepared> {
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
    let ranks = ranks(spec, opts);
    let global_accum = opts.grad_accum * ranks;
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
        ranks,
    })
}

/// Data-parallel ranks of the run: candle's group, or the HF engine's torchrun workers.
fn ranks(spec: &RunSpec, opts: &TrainOptions) -> usize {
    spec.dp_size().max(opts.hf_parallel.map_or(1, |p| p.size))
}

/// Warm-up steps (trained, not timed): the suite's, leaving at least one timed step.
pub fn warmup_steps(spec: &RunSpec, prep: &Prepared) -> usize {
    spec.warmup_batches.min(prep.total_steps.saturating_sub(1))
}
