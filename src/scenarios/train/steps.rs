//! A training run's steps as the scenario keeps them ([`Steps`], the engine's
//! [`StepBook`]): which blocks each step trains, in the seeded order every engine shares, and
//! each step's record, logged as it ends.

use super::prepare::Prepared;
use crate::engines::{StepBook, TimedStep};
use crate::error::Result;
use crate::log::RankLog;
use crate::metrics::TrainTotals;
use crate::record::{Record, StepRecord};
use crate::scenarios::spec::{RunSpec, TrainOptions};
use indicatif::ProgressBar;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Every optimizer step of a run: handed to the engine, logged as it ends, added up.
pub struct Steps<'a> {
    prep: &'a Prepared,
    log: &'a mut RankLog,
    micro: MicroBatches,
    /// Micro-batches a step draws (all ranks'), and this rank's share of them.
    per_step: usize,
    mine: std::ops::Range<usize>,
    warmup: usize,
    bar: ProgressBar,
    /// Steps handed out, micro-batches drawn, and the samples of the step handed out last.
    step: usize,
    micro_done: usize,
    n_samples: usize,
    pub totals: TrainTotals,
}

impl<'a> Steps<'a> {
    /// The steps of `prep`, logged to `log`, for data-parallel rank `dp_rank` of `prep.ranks`;
    /// the first `warmup` steps are not timed; `bar`: whether this process shows progress.
    pub fn new(
        spec: &RunSpec,
        opts: &TrainOptions,
        prep: &'a Prepared,
        log: &'a mut RankLog,
        dp_rank: usize,
        warmup: usize,
        bar: bool,
    ) -> Self {
        let (dp_n, ga) = (prep.ranks, opts.grad_accum);
        // The HF engine's torchrun workers take the whole step's micro-batches and share them out.
        let mine = match opts.hf_parallel {
            Some(_) => 0..ga * dp_n,
            None => dp_rank * ga..(dp_rank + 1) * ga,
        };
        Self {
            prep,
            log,
            micro: MicroBatches::new(
                spec.seed,
                prep.train_blocks.len(),
                spec.batch_size,
                opts.drop_last,
            ),
            per_step: ga * dp_n,
            mine,
            warmup,
            bar: crate::progress::steps(bar, prep.total_steps as u64),
            step: 0,
            micro_done: 0,
            n_samples: 0,
            totals: TrainTotals::default(),
        }
    }

    /// Clears the progress bar (after the last step, or one that failed).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl<'a> StepBook<'a> for Steps<'a> {
    /// Every rank draws the whole step's micro-batches (the same seeded order) and trains on
    /// its share: rank r takes micro-batches r·ga .. (r+1)·ga.
    fn next_step(&mut self) -> Option<Vec<Vec<&'a [u32]>>> {
        if self.step == self.prep.total_steps {
            self.bar.finish_and_clear();
            return None;
        }
        let ids: Vec<Vec<usize>> = (0..self.per_step).map(|_| self.micro.next()).collect();
        self.n_samples = ids.iter().map(Vec::len).sum();
        let blocks = &self.prep.train_blocks;
        Some(
            ids[self.mine.clone()]
                .iter()
                .map(|b| b.iter().map(|&i| blocks[i].as_slice()).collect())
                .collect(),
        )
    }

    fn step_done(&mut self, step: TimedStep) -> Result<()> {
        let TimedStep {
            outcome: out,
            latency_ms,
        } = step;
        self.micro_done += self.per_step;
        let record = StepRecord {
            step: self.step + 1,
            epoch: self.micro_done as f64 / self.prep.micro_per_epoch as f64,
            loss: out.loss,
            learning_rate: out.lr,
            grad_norm: out.grad_norm,
            latency_ms,
            n_samples: self.n_samples,
            n_tokens: self.n_samples * self.prep.block_size,
            warmup: self.step < self.warmup,
            skipped: out.skipped,
            loss_scale: out.loss_scale,
            phases_ms: out.phases_ms,
            comm_ms: out.comm_ms,
            host_ms: out.host_ms,
        };
        self.step += 1;
        self.totals.add(&record);
        self.log.write(&Record::Step(record))?;
        self.bar.inc(1);
        Ok(())
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
