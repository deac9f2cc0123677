//! How long a timed loop runs: pass after pass over the run's batches until both a minimum
//! measured time and a minimum count of timed batches are reached (`--min-time`,
//! `--min-batches`), as criterion and hyperfine run until a time and a count, so that a run of
//! a second or two is not decided by host noise.
//!
//! Passes are whole: every engine times the same mix of batches (LAMBADA's lengths vary
//! batch to batch), so a ratio of two engines does not depend on where each one stopped. The
//! measured time is the sum of the timed batches' latencies, the figure the rates divide by.
//! Accuracy and perplexity are scored on the first pass only: later passes time the same
//! batches again and carry no per-passage results.

use crate::device::DeviceSpec;
use crate::error::Result;

/// `--min-time` and `--min-batches`: the timed loop ends at the first pass end where both are
/// reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MinRun {
    /// Seconds of timed batches (the sum of their latencies).
    pub seconds: f64,
    /// Timed batches (generation: calls).
    pub batches: usize,
}

impl MinRun {
    /// One pass, whatever it lasts.
    pub const ONE_PASS: Self = Self {
        seconds: 0.,
        batches: 0,
    };

    /// The minimums on `device` unless given: 10 s and 10 batches on a GPU (a pass of gpt2 over
    /// LAMBADA lasts about 2 s on an H100, where host noise moved repeats by 9 %); none on the
    /// CPU, whose runs are tests, CI and the README's first run (a pass already takes seconds
    /// there, and a longer one only costs time).
    pub fn resolve(device: DeviceSpec, seconds: Option<f64>, batches: Option<usize>) -> Self {
        let gpu = matches!(device, DeviceSpec::Cuda(_));
        let (s, b) = if gpu { (10., 10) } else { (0., 0) };
        Self {
            seconds: seconds.unwrap_or(s),
            batches: batches.unwrap_or(b),
        }
    }

    /// Passes the count alone asks of `per_pass` batches (at least 1): what is known before the
    /// run (the time's passes are not), e.g. to spread a first pass's cold batches over.
    pub fn least_passes(&self, per_pass: usize) -> usize {
        self.batches.div_ceil(per_pass.max(1)).max(1)
    }

    /// Whether `batches` timed batches that took `seconds` are enough; `stalled`: the last
    /// pass measured no time, so no time can be reached (the count still holds).
    fn met(&self, seconds: f64, batches: usize, stalled: bool) -> bool {
        (seconds >= self.seconds || stalled) && batches >= self.batches
    }
}

/// One batch of the timed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// 0-based among every timed batch of the run (the log's `batch`).
    pub seq: usize,
    /// 0-based pass over the batches (the log's `pass`).
    pub pass: usize,
    /// The batch's index in a pass.
    pub index: usize,
}

/// The timed loop's schedule over `per_pass` batches: [`Passes::next`] gives the batch to time,
/// [`Passes::timed`] counts its latency.
#[derive(Debug)]
pub struct Passes {
    min: MinRun,
    per_pass: usize,
    /// Batches handed out so far.
    seq: usize,
    /// Seconds timed: in all, and at the start of the current pass.
    seconds: f64,
    pass_start_seconds: f64,
    done: bool,
}

impl Passes {
    pub fn new(min: MinRun, per_pass: usize) -> Self {
        Self {
            min,
            per_pass,
            seq: 0,
            seconds: 0.,
            pass_start_seconds: 0.,
            done: per_pass == 0,
        }
    }

    /// The next batch to time; None once a pass ends with both minimums met. `agree` turns
    /// this process's answer (stop or not) into its group's: the ranks of a tensor-parallel
    /// run must run the same batches, since every forward all-reduces. After a pass that
    /// measured no time only the count holds (no time could be reached).
    pub fn next(&mut self, agree: impl FnOnce(bool) -> Result<bool>) -> Result<Option<Slot>> {
        if self.done {
            return Ok(None);
        }
        let index = self.seq % self.per_pass;
        if index == 0 && self.seq > 0 {
            let stalled = self.seconds <= self.pass_start_seconds;
            if agree(self.min.met(self.seconds, self.seq, stalled))? {
                self.done = true;
                return Ok(None);
            }
            self.pass_start_seconds = self.seconds;
        }
        let slot = Slot {
            seq: self.seq,
            pass: self.seq / self.per_pass,
            index,
        };
        self.seq += 1;
        Ok(Some(slot))
    }

    /// Counts the latency of the batch [`Passes::next`] gave last.
    pub fn timed(&mut self, latency_ms: f64) {
        self.seconds += latency_ms / 1e3;
    }

    /// Passes started.
    pub fn passes(&self) -> usize {
        self.seq.div_ceil(self.per_pass.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the schedule with every batch taking `ms`; the slots it handed out.
    fn run(min: MinRun, per_pass: usize, ms: f64) -> Vec<Slot> {
        let mut p = Passes::new(min, per_pass);
        let mut slots = vec![];
        while let Some(s) = p.next(Ok).unwrap() {
            slots.push(s);
            p.timed(ms);
        }
        assert_eq!(p.passes(), slots.last().map_or(0, |s| s.pass + 1));
        slots
    }

    fn min(seconds: f64, batches: usize) -> MinRun {
        MinRun { seconds, batches }
    }

    #[test]
    fn one_pass_without_minimums() {
        let s = run(MinRun::ONE_PASS, 7, 1.);
        assert_eq!(s.len(), 7);
        assert!(s
            .iter()
            .enumerate()
            .all(|(i, s)| s.seq == i && s.index == i));
        assert!(s.iter().all(|s| s.pass == 0));
        assert!(
            run(min(10., 10), 0, 1.).is_empty(),
            "no batch: nothing to time"
        );
    }

    #[test]
    fn the_count_is_reached_in_whole_passes() {
        // 7 batches a pass, at least 10: two passes, 14 batches.
        let s = run(min(0., 10), 7, 1.);
        assert_eq!(s.len(), 14);
        assert_eq!(
            s[7],
            Slot {
                seq: 7,
                pass: 1,
                index: 0
            }
        );
        assert_eq!(
            s[13],
            Slot {
                seq: 13,
                pass: 1,
                index: 6
            }
        );
    }

    /// The time is the batches' latencies (a fake clock): 4 batches of 300 ms a pass, at least
    /// 2.5 s: 3 passes (3.6 s), not 2 (2.4 s).
    #[test]
    fn the_time_is_reached_in_whole_passes() {
        let s = run(min(2.5, 1), 4, 300.);
        assert_eq!(s.len(), 12);
        assert_eq!(s.last().unwrap().pass, 2);
        // Both minimums: the count decides here.
        assert_eq!(run(min(0.1, 20), 4, 300.).len(), 20);
    }

    #[test]
    fn a_pass_that_measures_no_time_leaves_the_count() {
        assert_eq!(run(min(5., 0), 3, 0.).len(), 3);
        assert_eq!(run(min(5., 7), 3, 0.).len(), 9);
    }

    #[test]
    fn the_group_decides_at_each_pass_end() {
        // A rank whose own minimums are met goes on while rank 0 says so, and stops with it.
        let mut p = Passes::new(MinRun::ONE_PASS, 2);
        let mut asked = vec![];
        let mut n = 0;
        while p
            .next(|mine| {
                asked.push(mine);
                Ok(asked.len() == 3)
            })
            .unwrap()
            .is_some()
        {
            p.timed(1.);
            n += 1;
        }
        assert_eq!((n, asked, p.passes()), (6, vec![true, true, true], 3));
    }

    /// Two passes of two batches (2 passages each, 100 ms): the rates count all four, accuracy
    /// and perplexity the first pass only (the second's records carry no passages; one that
    /// did would not count twice).
    #[test]
    fn totals_count_every_pass_and_score_the_first() {
        use crate::metrics::BatchTotals;
        use crate::record::{BatchRecord, PassageResult};
        let passage = |index, greedy| PassageResult {
            index,
            ll: -1.,
            greedy,
            n_context_tokens: 4,
            n_target_tokens: 1,
        };
        let record = |seq: usize, pass: usize| BatchRecord {
            batch: seq,
            pass,
            n_samples: 2,
            n_tokens: 10,
            padded_len: 5,
            latency_ms: 100.,
            passages: vec![
                passage(seq % 2 * 2, true),
                passage(seq % 2 * 2 + 1, pass > 0),
            ],
        };
        let mut t = BatchTotals::default();
        (0..4).for_each(|seq| t.add(&record(seq, seq / 2)));
        let s = t.summary(None, 1., Default::default());
        assert_eq!(
            (s.n_samples, s.timed_samples, s.passes),
            (4, Some(8), Some(2))
        );
        assert_eq!((s.n_batches, s.n_tokens), (4, 40));
        assert!(
            (s.samples_per_second - 20.).abs() < 1e-9,
            "8 samples in 0.4 s"
        );
        assert_eq!(s.accuracy, 0.5, "the first pass: 2 of 4 greedy");
        assert!((s.perplexity - 1f64.exp()).abs() < 1e-12);
    }

    /// The same for generation: prompts and accuracy of the first pass, rates over both.
    #[test]
    fn generation_totals_count_every_pass_and_score_the_first() {
        use crate::metrics::GenTotals;
        use crate::record::{GenBatchRecord, GenPassage};
        let record = |seq: usize, pass: usize| GenBatchRecord {
            batch: seq,
            pass,
            n_samples: 2,
            prompt_len: 4,
            padded_len: Some(4),
            n_prompt_tokens: 8,
            new_tokens: 3,
            latency_ms: 50.,
            ttft_ms: None,
            itl_ms: vec![],
            passages: (0..2)
                .map(|i| GenPassage {
                    index: i,
                    correct: i == 0 || pass > 0,
                    generated: vec![1, 2, 3],
                })
                .collect(),
        };
        let mut t = GenTotals::default();
        (0..3).for_each(|seq| t.add(&record(seq, seq)));
        let s = t.summary(None, 1., Default::default(), None);
        assert_eq!(
            (s.n_samples, s.timed_samples, s.passes),
            (2, Some(6), Some(3))
        );
        assert!(
            (s.samples_per_second - 40.).abs() < 1e-9,
            "6 prompts in 0.15 s"
        );
        assert_eq!(s.generated_tokens_per_second, Some(120.));
        assert_eq!(s.accuracy, 0.5);
    }

    #[test]
    fn defaults_apply_on_gpus_only() {
        let gpu = MinRun::resolve(DeviceSpec::Cuda(0), None, None);
        assert_eq!(gpu, min(10., 10));
        assert_eq!(
            MinRun::resolve(DeviceSpec::Cpu, None, None),
            MinRun::ONE_PASS
        );
        assert_eq!((gpu.least_passes(7), gpu.least_passes(300)), (2, 1));
        let given = MinRun::resolve(DeviceSpec::Cuda(0), Some(2.), Some(0));
        assert_eq!(given, min(2., 0));
        assert_eq!(
            MinRun::resolve(DeviceSpec::Cpu, None, Some(30)),
            min(0., 30)
        );
    }
}
