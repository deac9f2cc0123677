//! Every metric the bench reports, defined once, with its formula (the serving suite's: [`serving`]).

pub mod serving;
use crate::error::message_without_backtrace;
use crate::record::{
    BatchRecord, GenBatchRecord, PhaseMs, RunStatus, Spread, StepRecord, Summary, TrainSummary,
};
use crate::trackers::{peak_rss_bytes, MemoryReading};
use serde::{Deserialize, Serialize};

/// Summary statistics of a sample (e.g. per-batch latencies in ms).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Distribution {
    pub count: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator); 0 for fewer than 2 values.
    pub stdev: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Percentile `q` in [0, 100] of sorted values, linear interpolation between closest ranks
/// (numpy's default `linear` method).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = q / 100. * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

impl Distribution {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let stdev = if values.len() < 2 {
            0.
        } else {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.)).sqrt()
        };
        Self {
            count: values.len(),
            mean,
            stdev,
            min: sorted[0],
            p50: percentile(&sorted, 50.),
            p90: percentile(&sorted, 90.),
            p99: percentile(&sorted, 99.),
            max: sorted[sorted.len() - 1],
        }
    }
}

/// LAMBADA accuracy: the fraction of passages whose every target token is the model's argmax
/// (lm-eval `lambada_openai` `acc`).
pub fn lambada_accuracy(greedy: &[bool]) -> f64 {
    greedy.iter().filter(|g| **g).count() as f64 / greedy.len() as f64
}

/// LAMBADA perplexity: exp(−mean over passages of the summed log-likelihood of the target
/// word's tokens) (lm-eval `lambada_openai` `perplexity`).
pub fn lambada_perplexity(log_likelihoods: &[f64]) -> f64 {
    (-log_likelihoods.iter().sum::<f64>() / log_likelihoods.len() as f64).exp()
}

/// Items per second over a timed region.
pub fn per_second(count: f64, seconds: f64) -> f64 {
    count / seconds
}

/// Resamples of [`bootstrap_ci95`].
const BOOTSTRAP_RESAMPLES: usize = 1000;

/// A 95 % percentile-bootstrap interval of a statistic of `n` batches: `stat` of the batches at
/// the indices it is given, over 1000 resamples of `n` indices drawn with replacement from a
/// fixed seed (one log always gives one interval). None for fewer than 2 batches.
pub fn bootstrap_ci95(n: usize, stat: impl Fn(&[usize]) -> f64) -> Option<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    if n < 2 {
        return None;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut picks = vec![0; n];
    let mut stats: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            picks.iter_mut().for_each(|p| *p = rng.random_range(0..n));
            stat(&picks)
        })
        .collect();
    stats.sort_by(f64::total_cmp);
    Some((percentile(&stats, 2.5), percentile(&stats, 97.5)))
}

/// Robust standard deviations from the median beyond which a value is an outlier
/// (Iglewicz and Hoaglin's modified z-score cut-off).
const OUTLIER_Z: f64 = 3.5;

/// How many of `xs` lie more than [`OUTLIER_Z`] robust standard deviations (1.4826 × the
/// median absolute deviation) from their median: batches a busy host, a recompile or a clock
/// change slowed, which a mean would hide. None for fewer than 3 values; where the MAD is 0
/// (most values equal), every value off the median counts.
pub fn mad_outliers(xs: &[f64]) -> Option<u64> {
    if xs.len() < 3 {
        return None;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(v, 50.)
    };
    let m = median(&mut xs.to_vec());
    let mad = median(&mut xs.iter().map(|x| (x - m).abs()).collect());
    let far = |x: &&f64| match mad > 0. {
        true => (*x - m).abs() / (1.4826 * mad) > OUTLIER_Z,
        false => **x != m,
    };
    Some(xs.iter().filter(far).count() as u64)
}

/// The 95 % intervals of a run's samples/s (Σ samples / Σ latency over the batches drawn) and
/// of its batch latency p50, from each timed batch's (latency ms, samples).
fn batch_intervals(latencies_ms: &[f64], samples: &[usize]) -> BatchIntervals {
    let rate = bootstrap_ci95(latencies_ms.len(), |picks| {
        let n: usize = picks.iter().map(|&i| samples[i]).sum();
        let ms: f64 = picks.iter().map(|&i| latencies_ms[i]).sum();
        per_second(n as f64, ms / 1e3)
    });
    let p50 = bootstrap_ci95(latencies_ms.len(), |picks| {
        let mut lat: Vec<f64> = picks.iter().map(|&i| latencies_ms[i]).collect();
        lat.sort_by(f64::total_cmp);
        percentile(&lat, 50.)
    });
    // Per sample, so that a short last batch is not an outlier for being short.
    let per_sample: Vec<f64> = latencies_ms
        .iter()
        .zip(samples)
        .map(|(ms, &n)| ms / n.max(1) as f64)
        .collect();
    let outliers = mad_outliers(&per_sample);
    BatchIntervals {
        rate,
        p50,
        outliers,
    }
}

/// See [`batch_intervals`].
struct BatchIntervals {
    rate: Option<(f64, f64)>,
    p50: Option<(f64, f64)>,
    outliers: Option<u64>,
}

impl BatchIntervals {
    /// Sets the summary's interval fields.
    fn apply(self, s: Summary) -> Summary {
        Summary {
            samples_per_second_ci95_low: self.rate.map(|r| r.0),
            samples_per_second_ci95_high: self.rate.map(|r| r.1),
            latency_ms_p50_ci95_low: self.p50.map(|r| r.0),
            latency_ms_p50_ci95_high: self.p50.map(|r| r.1),
            latency_outliers: self.outliers,
            ..s
        }
    }
}

/// What the finished batches of a run add up to; the one place a [`Summary`] is computed,
/// for a whole run and for a killed run's log completed later (see `crate::launch::sweep`).
/// Rates count every timed batch of every pass; accuracy and perplexity the first pass.
#[derive(Default)]
pub struct BatchTotals {
    latencies_ms: Vec<f64>,
    /// Passages of each batch.
    samples: Vec<usize>,
    lls: Vec<f64>,
    greedy: Vec<bool>,
    n_tokens: usize,
    passes: usize,
}

impl BatchTotals {
    pub fn add(&mut self, batch: &BatchRecord) {
        self.latencies_ms.push(batch.latency_ms);
        self.samples.push(batch.n_samples);
        self.n_tokens += batch.n_tokens;
        self.passes = self.passes.max(batch.pass + 1);
        if batch.pass == 0 {
            self.lls.extend(batch.passages.iter().map(|p| p.ll));
            self.greedy.extend(batch.passages.iter().map(|p| p.greedy));
        }
    }

    /// `failure`: the error that ended the run early, whose words decide `oom` vs `error`.
    pub fn summary(
        &self,
        failure: Option<String>,
        wall_seconds: f64,
        mem: MemoryReading,
    ) -> Summary {
        let timed_seconds = self.latencies_ms.iter().sum::<f64>() / 1e3;
        let lat = Distribution::of(&self.latencies_ms);
        // No finished batch: no latency either (null in the log, not 0).
        let ms = |v: f64| if lat.count == 0 { f64::NAN } else { v };
        let (n, timed) = (self.lls.len(), self.samples.iter().sum::<usize>());
        let status = RunStatus::of_result(failure.as_deref());
        let intervals = batch_intervals(&self.latencies_ms, &self.samples);
        intervals.apply(Summary {
            status,
            error: failure,
            n_samples: n,
            n_batches: self.latencies_ms.len(),
            n_tokens: self.n_tokens,
            timed_samples: Some(timed),
            passes: Some(self.passes),
            accuracy: if n > 0 {
                lambada_accuracy(&self.greedy)
            } else {
                f64::NAN
            },
            perplexity: if n > 0 {
                lambada_perplexity(&self.lls)
            } else {
                f64::NAN
            },
            samples_per_second: per_second(timed as f64, timed_seconds),
            tokens_per_second: per_second(self.n_tokens as f64, timed_seconds),
            latency_ms_p50: ms(lat.p50),
            latency_ms_p90: ms(lat.p90),
            latency_ms_p99: ms(lat.p99),
            latency_ms_mean: ms(lat.mean),
            latency_ms_stdev: ms(lat.stdev),
            timed_seconds,
            wall_seconds,
            peak_memory_bytes: mem.peak_bytes,
            device_memory_used_bytes: mem.device_used_bytes,
            peak_host_memory_bytes: peak_rss_bytes(),
            pool_reserved_bytes: mem.pool_reserved_bytes,
            nvml_peak_process_memory_bytes: None,
            nvml_peak_device_memory_used_bytes: None,
            sm_clock_mhz_median: None,
            gpu_utilization_percent_median: None,
            power_watts_mean: None,
            gpu_samples: None,
            energy_joules: None,
            energy_seconds: None,
            joules_per_sample: None,
            model_flops: None,
            achieved_tflop_per_second: None,
            peak_tflop_per_second: None,
            mfu: None,
            generated_tokens_per_second: None,
            decode_tokens_per_second: None,
            ttft_ms_p50: None,
            ttft_ms_p90: None,
            itl_ms_p50: None,
            itl_ms_p90: None,
            itl_ms_p99: None,
            kv_cache_bytes: None,
            compiles_timed: None,
            samples_per_second_ci95_low: None,
            samples_per_second_ci95_high: None,
            latency_ms_p50_ci95_low: None,
            latency_ms_p50_ci95_high: None,
            latency_outliers: None,
        })
    }
}

/// What the timed generation calls of a run add up to; the one place a generation run's
/// [`Summary`] is computed. Rates over the sum of call latencies:
/// - samples/s = prompts / s; generated tokens/s = rows · N / s (also `tokens_per_second`),
///   every timed call of every pass;
/// - decode tokens/s = Σ rows · (N − 1) / Σ (latency − time to first token), timed steps only;
/// - accuracy (`lambada`) = passages whose generated ids start with the target's / passages,
///   over the first pass.
#[derive(Default)]
pub struct GenTotals {
    latencies_ms: Vec<f64>,
    /// Prompts of each call.
    samples: Vec<usize>,
    /// Prompts of the first pass.
    n_samples: usize,
    passes: usize,
    n_generated: usize,
    decode_tokens: usize,
    decode_ms: f64,
    ttft_ms: Vec<f64>,
    itl_ms: Vec<f64>,
    correct: Vec<bool>,
}

impl GenTotals {
    pub fn add(&mut self, b: &GenBatchRecord) {
        self.latencies_ms.push(b.latency_ms);
        self.samples.push(b.n_samples);
        self.passes = self.passes.max(b.pass + 1);
        if b.pass == 0 {
            self.n_samples += b.n_samples;
            self.correct.extend(b.passages.iter().map(|p| p.correct));
        }
        self.n_generated += b.n_samples * b.new_tokens;
        if let Some(ttft) = b.ttft_ms {
            self.ttft_ms.push(ttft);
            self.decode_tokens += b.n_samples * b.new_tokens.saturating_sub(1);
            self.decode_ms += b.latency_ms - ttft;
        }
        self.itl_ms.extend(&b.itl_ms);
    }

    /// `failure`: the error that ended the run early; `kv_cache_bytes`: of the largest call.
    pub fn summary(
        &self,
        failure: Option<String>,
        wall_seconds: f64,
        mem: MemoryReading,
        kv_cache_bytes: Option<u64>,
    ) -> Summary {
        let timed_seconds = self.latencies_ms.iter().sum::<f64>() / 1e3;
        let lat = Distribution::of(&self.latencies_ms);
        let ttft = Distribution::of(&self.ttft_ms);
        let itl = Distribution::of(&self.itl_ms);
        let some = |d: &Distribution, v: f64| (d.count > 0).then_some(v);
        let ms = |v: f64| if lat.count == 0 { f64::NAN } else { v };
        let generated = per_second(self.n_generated as f64, timed_seconds);
        let intervals = batch_intervals(&self.latencies_ms, &self.samples);
        let timed: usize = self.samples.iter().sum();
        intervals.apply(Summary {
            n_samples: self.n_samples,
            n_batches: self.latencies_ms.len(),
            n_tokens: self.n_generated,
            timed_samples: Some(timed),
            passes: Some(self.passes),
            accuracy: match self.correct.is_empty() {
                true => f64::NAN,
                false => lambada_accuracy(&self.correct),
            },
            perplexity: f64::NAN,
            samples_per_second: per_second(timed as f64, timed_seconds),
            tokens_per_second: generated,
            latency_ms_p50: ms(lat.p50),
            latency_ms_p90: ms(lat.p90),
            latency_ms_p99: ms(lat.p99),
            latency_ms_mean: ms(lat.mean),
            latency_ms_stdev: ms(lat.stdev),
            timed_seconds,
            generated_tokens_per_second: Some(generated),
            decode_tokens_per_second: (self.decode_ms > 0.)
                .then(|| self.decode_tokens as f64 / (self.decode_ms / 1e3)),
            ttft_ms_p50: some(&ttft, ttft.p50),
            ttft_ms_p90: some(&ttft, ttft.p90),
            itl_ms_p50: some(&itl, itl.p50),
            itl_ms_p90: some(&itl, itl.p90),
            itl_ms_p99: some(&itl, itl.p99),
            kv_cache_bytes,
            ..BatchTotals::default().summary(failure, wall_seconds, mem)
        })
    }
}

/// What the optimizer steps of a training run add up to; the one place a [`TrainSummary`]'s
/// rates and losses are computed. Warm-up steps count in the losses, not in the rates.
#[derive(Default)]
pub struct TrainTotals {
    /// Loss of every step, warm-up included (HF's `train_loss` averages them all).
    pub losses: Vec<f64>,
    /// Latency of every timed step.
    pub timed_ms: Vec<f64>,
    pub timed_samples: usize,
    pub timed_tokens: usize,
    /// Milliseconds of the timed steps spent in all-reduces (data parallelism), and whether
    /// any step timed them (ZeRO-2/3's collectives run inside the backward: not timed).
    pub comm_ms: f64,
    pub comm_timed: bool,
    /// Phase times of the timed steps (`--phase-times`).
    pub phases: Vec<PhaseMs>,
    /// The host's queueing time of the timed steps, where the engine measures it.
    pub host_ms: Vec<f64>,
    /// Latency of every warm-up step.
    pub warmup_ms: Vec<f64>,
}

/// The evaluation after training: mean loss per block and its runtime.
pub struct EvalResult {
    pub loss: f64,
    pub runtime_seconds: f64,
    pub n_blocks: usize,
}

impl TrainTotals {
    /// Adds one step (warm-up steps count in the losses only).
    pub fn add(&mut self, step: &StepRecord) {
        self.losses.push(step.loss);
        if step.warmup {
            self.warmup_ms.push(step.latency_ms);
        } else {
            self.timed_ms.push(step.latency_ms);
            self.timed_samples += step.n_samples;
            self.timed_tokens += step.n_tokens;
            self.comm_ms += step.comm_ms.unwrap_or(0.);
            self.comm_timed |= step.comm_ms.is_some();
            self.phases.extend(step.phases_ms);
            self.host_ms.extend(step.host_ms);
        }
    }

    /// The summary: rates over the timed steps' latencies (train_runtime is their sum);
    /// `comm_share` = all-reduce ms / timed ms, for data-parallel runs.
    pub fn summary(
        &self,
        failure: Option<&crate::error::Error>,
        warmup: usize,
        eval: EvalResult,
        data_parallel: bool,
    ) -> TrainSummary {
        let runtime = self.timed_ms.iter().sum::<f64>() / 1e3;
        let d = Distribution::of(&self.timed_ms);
        let losses = &self.losses;
        TrainSummary {
            // `oom` or `error` by the message's words, as for LAMBADA runs.
            status: RunStatus::of_result(failure.map(|e| e.to_string()).as_deref()),
            error: failure.map(|e| message_without_backtrace(&e.to_string())),
            n_steps: losses.len(),
            warmup_steps: warmup.min(losses.len()),
            train_runtime: runtime,
            train_samples_per_second: per_second(self.timed_samples as f64, runtime),
            train_steps_per_second: per_second(self.timed_ms.len() as f64, runtime),
            tokens_per_second: per_second(self.timed_tokens as f64, runtime),
            train_loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
            first_loss: losses.first().copied().unwrap_or(f64::NAN),
            last_loss: losses.last().copied().unwrap_or(f64::NAN),
            eval_loss: eval.loss,
            eval_runtime: eval.runtime_seconds,
            eval_samples_per_second: per_second(eval.n_blocks as f64, eval.runtime_seconds),
            perplexity: eval.loss.exp(),
            step_latency_ms_p50: d.p50,
            step_latency_ms_p90: d.p90,
            step_latency_ms_mean: d.mean,
            wall_seconds: f64::NAN,
            peak_memory_bytes: 0,
            peak_host_memory_bytes: peak_rss_bytes(),
            comm_share: (data_parallel && self.comm_timed)
                .then(|| self.comm_ms / (runtime * 1e3).max(f64::MIN_POSITIVE)),
            per_rank_peak_memory_bytes: None,
            phases_ms_p50: self.phases_p50(),
            host_ms_p50: (!self.host_ms.is_empty()).then(|| Distribution::of(&self.host_ms).p50),
            warmup_runtime: (!self.warmup_ms.is_empty())
                .then(|| self.warmup_ms.iter().sum::<f64>() / 1e3),
            model_flops: None,
            achieved_tflop_per_second: None,
            peak_tflop_per_second: None,
            mfu: None,
            epoch_seconds: None,
            peak_memory_share: None,
        }
    }

    /// Median of each phase over the timed steps (None without `--phase-times`).
    fn phases_p50(&self) -> Option<PhaseMs> {
        let p50 = |f: fn(&PhaseMs) -> f64| {
            Distribution::of(&self.phases.iter().map(f).collect::<Vec<_>>()).p50
        };
        (!self.phases.is_empty()).then(|| PhaseMs {
            forward: p50(|p| p.forward),
            backward: p50(|p| p.backward),
            update: p50(|p| p.update),
        })
    }
}

/// Median, extremes and CV of `values` (None if empty).
pub fn spread(values: &[f64]) -> Option<Spread> {
    if values.is_empty() {
        return None;
    }
    let d = Distribution::of(values);
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(Spread {
        median: percentile(&sorted, 50.),
        min: d.min,
        max: d.max,
        cv: if d.mean != 0. { d.stdev / d.mean } else { 0. },
    })
}

/// Relative tolerance of LAMBADA perplexity, candle against HF, in fp32/tf32: the engines sum
/// in different orders and TF32 matmuls round per engine, nothing more.
pub const SCORE_PPL_REL_TOL_FULL: f64 = 1e-3;
/// The same in bf16/fp16: the engines round at different points (HF takes softmax and ALiBi in
/// half precision, candle in fp32).
pub const SCORE_PPL_REL_TOL_HALF: f64 = 1e-2;
/// Accuracy difference allowed in fp32/tf32: none, every passage's argmax is the same.
pub const SCORE_ACC_TOL_FULL: f64 = 0.;
/// Accuracy difference allowed in bf16/fp16: a borderline argmax can flip under the other
/// engine's rounding (0.005 is about 26 of LAMBADA's 5153 passages).
pub const SCORE_ACC_TOL_HALF: f64 = 5e-3;
/// Relative tolerance of the first training step's loss, candle against HF, in fp32/tf32: the
/// LAMBADA tolerance (summation order and TF32 matmuls differ between the engines).
pub const FIRST_LOSS_REL_TOL_FULL: f64 = 1e-3;
/// The same in bf16/fp16: torch autocast picks each op's precision, candle casts its weights
/// per step, so the two round at different points.
pub const FIRST_LOSS_REL_TOL_HALF: f64 = 1e-2;

/// fp32 and tf32 compare at the full-precision tolerances, bf16 and fp16 at the half ones.
fn full_precision(dtype: &str) -> bool {
    matches!(dtype, "fp32" | "tf32")
}

/// Whether candle and HF agree on a LAMBADA scoring run (`--engine both`; `bench` exits 1 when
/// they do not): |Δ accuracy| ≤ the accuracy tolerance and |Δ perplexity| / HF's perplexity ≤
/// the perplexity tolerance of the run's precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreAgreement {
    pub agree: bool,
    /// |candle − HF| accuracy.
    pub accuracy_diff: f64,
    pub accuracy_tol: f64,
    /// |candle − HF| / HF perplexity.
    pub perplexity_rel: f64,
    pub perplexity_tol: f64,
}

/// See [`ScoreAgreement`].
pub fn score_agreement(dtype: &str, candle: &Summary, hf: &Summary) -> ScoreAgreement {
    let full = full_precision(dtype);
    let (perplexity_tol, accuracy_tol) = match full {
        true => (SCORE_PPL_REL_TOL_FULL, SCORE_ACC_TOL_FULL),
        false => (SCORE_PPL_REL_TOL_HALF, SCORE_ACC_TOL_HALF),
    };
    let perplexity_rel = (candle.perplexity - hf.perplexity).abs() / hf.perplexity;
    let accuracy_diff = (candle.accuracy - hf.accuracy).abs();
    ScoreAgreement {
        agree: accuracy_diff <= accuracy_tol && perplexity_rel <= perplexity_tol,
        accuracy_diff,
        accuracy_tol,
        perplexity_rel,
        perplexity_tol,
    }
}

/// Whether candle and HF agree on a training run with dropout off (`bench` exits 1 when they
/// do not): the first step's loss (same weights, same first batch, nothing trained yet), |Δ| /
/// |HF's| ≤ the tolerance of the run's precision. With dropout on the masks are random per
/// engine, so no step's loss is comparable and nothing is checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossAgreement {
    pub agree: bool,
    pub rel: f64,
    pub tol: f64,
}

/// See [`LossAgreement`].
pub fn first_loss_agreement(dtype: &str, candle: f64, hf: f64) -> LossAgreement {
    let tol = match full_precision(dtype) {
        true => FIRST_LOSS_REL_TOL_FULL,
        false => FIRST_LOSS_REL_TOL_HALF,
    };
    let rel = (candle - hf).abs() / hf.abs();
    LossAgreement {
        agree: rel <= tol,
        rel,
        tol,
    }
}

/// Generated ids of two generation runs, passage by passage: (passages whose ids are
/// identical, passages both have); None when they share none. Informational: engines that
/// round differently may pick another token where two logits are close, so nothing fails on it.
pub fn identical_generations(
    a: &std::collections::BTreeMap<usize, Vec<u32>>,
    b: &std::collections::BTreeMap<usize, Vec<u32>>,
) -> Option<(usize, usize)> {
    let common: Vec<_> = a.iter().filter(|(k, _)| b.contains_key(k)).collect();
    if common.is_empty() {
        return None;
    }
    let same = common.iter().filter(|(k, v)| b[k] == **v).count();
    Some((same, common.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates_like_numpy() {
        let v = [1., 2., 3., 4.];
        // numpy.percentile([1,2,3,4], [50, 90, 99]) = 2.5, 3.7, 3.97
        assert_eq!(percentile(&v, 50.), 2.5);
        assert!((percentile(&v, 90.) - 3.7).abs() < 1e-12);
        assert!((percentile(&v, 99.) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[5.], 99.), 5.);
    }

    #[test]
    fn distribution_uses_sample_stdev() {
        let d = Distribution::of(&[2., 4., 4., 4., 5., 5., 7., 9.]);
        assert_eq!(d.mean, 5.);
        assert!((d.stdev - (32f64 / 7.).sqrt()).abs() < 1e-12);
        assert_eq!((d.min, d.max, d.count), (2., 9., 8));
    }

    /// The interval of a mean from one seed: the same twice, around the estimate, narrower
    /// with more batches of the same spread, none from one batch.
    #[test]
    fn bootstrap_intervals_are_seeded_and_narrow_with_more_batches() {
        fn mean(v: &[f64]) -> impl Fn(&[usize]) -> f64 + '_ {
            move |picks| picks.iter().map(|&i| v[i]).sum::<f64>() / picks.len() as f64
        }
        let few: Vec<f64> = (0..10).map(|i| 10. + (i % 5) as f64).collect();
        let many: Vec<f64> = (0..1000).map(|i| 10. + (i % 5) as f64).collect();
        let (a, b) = bootstrap_ci95(few.len(), mean(&few)).unwrap();
        assert_eq!(bootstrap_ci95(few.len(), mean(&few)), Some((a, b)));
        assert!(a < 12. && 12. < b, "{a} {b}");
        let (c, d) = bootstrap_ci95(many.len(), mean(&many)).unwrap();
        assert!(
            c < 12. && 12. < d && d - c < (b - a) / 5.,
            "{c} {d} vs {a} {b}"
        );
        assert_eq!(bootstrap_ci95(1, mean(&few)), None);
    }

    /// One slow batch among steady ones is the one outlier; steady batches have none; two
    /// batches are too few to say.
    #[test]
    fn mad_flags_the_batch_far_from_the_others() {
        let steady = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3];
        assert_eq!(mad_outliers(&steady), Some(0));
        let mut slowed = steady.to_vec();
        slowed.push(28_000.0); // a recompile inside the timed loop
        assert_eq!(mad_outliers(&slowed), Some(1));
        assert_eq!(mad_outliers(&[1.0, 50.0]), None);
        assert_eq!(mad_outliers(&[2.0, 2.0, 2.0, 3.0]), Some(1));
    }

    #[test]
    fn lambada_metrics_follow_lm_eval() {
        assert_eq!(lambada_accuracy(&[true, false, true, true]), 0.75);
        let ppl = lambada_perplexity(&[-1., -3.]);
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
    }

    #[test]
    fn a_summary_of_a_run_that_died_before_any_batch_reads_back() {
        // No batch, no wall time measured (a log completed after its process died): NaN
        // fields are written as null and read back as NaN.
        let s = BatchTotals::default().summary(Some("killed".into()), f64::NAN, Default::default());
        let line = serde_json::to_string(&crate::record::Record::Summary(Box::new(s))).unwrap();
        assert!(line.contains("\"wall_seconds\":null"), "{line}");
        let crate::record::Record::Summary(back) = serde_json::from_str(&line).unwrap() else {
            panic!("summary")
        };
        assert!(back.wall_seconds.is_nan() && back.accuracy.is_nan());
    }

    #[test]
    fn spread_of_repeats() {
        let s = spread(&[100., 102., 98.]).unwrap();
        assert_eq!((s.median, s.min, s.max), (100., 98., 102.));
        assert!((s.cv - 0.02).abs() < 1e-12);
        assert!(spread(&[]).is_none());
    }

    #[test]
    fn agreement_tolerances_follow_the_precision() {
        let summary = |accuracy: f64, perplexity: f64| Summary {
            accuracy,
            perplexity,
            ..BatchTotals::default().summary(None, 1., Default::default())
        };
        let h = summary(0.5, 10.);
        assert!(score_agreement("fp32", &summary(0.5, 10.005), &h).agree);
        assert!(!score_agreement("fp32", &summary(0.5, 10.02), &h).agree);
        let a = score_agreement("bf16", &summary(0.504, 10.05), &h);
        assert!(
            a.agree && a.perplexity_tol == SCORE_PPL_REL_TOL_HALF,
            "{a:?}"
        );
        assert!(!score_agreement("fp32", &summary(0.501, 10.), &h).agree);
        assert!(first_loss_agreement("tf32", 10.005, 10.).agree);
        assert!(!first_loss_agreement("tf32", 10.02, 10.).agree);
        assert!(first_loss_agreement("fp16", 10.05, 10.).agree);
        let ids = |v: &[(usize, u32)]| v.iter().map(|(k, t)| (*k, vec![*t])).collect();
        let (a, b) = (
            ids(&[(0, 1), (1, 2), (5, 3)]),
            ids(&[(0, 1), (1, 9), (7, 3)]),
        );
        assert_eq!(identical_generations(&a, &b), Some((1, 2)));
        assert_eq!(identical_generations(&a, &ids(&[(9, 1)])), None);
    }
}
