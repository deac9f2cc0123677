//! Every metric the bench reports, defined once, with its formula.

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

    #[test]
    fn lambada_metrics_follow_lm_eval() {
        assert_eq!(lambada_accuracy(&[true, false, true, true]), 0.75);
        let ppl = lambada_perplexity(&[-1., -3.]);
        assert!((ppl - 2f64.exp()).abs() < 1e-12);
    }
}
