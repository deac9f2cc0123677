//! The serving suite's load: when each request arrives and how long its prompt and output
//! are, all drawn from `--seed`, so a run's load is the same on every machine.
//!
//! Arrivals as vLLM's `benchmark_serving` makes them: the first at 0, then inter-arrival times
//! drawn from a gamma distribution of shape B = `--burstiness` and scale 1 / (R · B) (mean
//! 1 / R for R = `--request-rate` requests/s); B = 1 is a Poisson process (exponential gaps),
//! B < 1 burstier, B > 1 more even. An infinite rate schedules every request at 0.

use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Gamma};

/// A length in tokens: fixed (`N`) or drawn uniformly from an inclusive range (`A:B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LenRange {
    pub min: usize,
    pub max: usize,
}

impl LenRange {
    /// `N` or `A:B` (1 ≤ A ≤ B) for flag `flag`; a one-line error naming the form otherwise.
    pub fn parse(text: &str, flag: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "{flag} '{text}': expected N or A:B (tokens, at least 1; A:B drawn uniformly, A ≤ B)"
            ))
        };
        let num = |s: &str| s.trim().parse::<usize>().map_err(|_| bad());
        let (min, max) = match text.split_once(':') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(text)?, num(text)?),
        };
        if min == 0 || min > max {
            return Err(bad());
        }
        Ok(Self { min, max })
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> usize {
        rng.random_range(self.min..=self.max)
    }
}

/// What load a run puts on the engine (from the flags and the suite file).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSpec {
    /// Timed requests.
    pub num_requests: usize,
    /// Requests/s (`f64::INFINITY`: every request scheduled at 0).
    pub request_rate: f64,
    /// Gamma shape of the inter-arrival times (1: Poisson).
    pub burstiness: f64,
    /// Requests in flight at most (closed loop); None: open loop.
    pub max_concurrency: Option<usize>,
    pub input_len: LenRange,
    pub output_len: LenRange,
    pub seed: u64,
}

/// One request of the schedule, before it is served.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// When the arrival process sends it, ms from the clock's 0.
    pub scheduled_ms: f64,
    pub input_len: usize,
    pub output_len: usize,
}

/// Independent streams of one seed: changing how lengths are drawn leaves arrivals alone.
const ARRIVAL_STREAM: u64 = 1;
const LENGTH_STREAM: u64 = 2;
const PROMPT_STREAM: u64 = 3;

fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(stream);
    r
}

/// `n` arrival times, ms: the first at 0, then cumulative gamma gaps (module comment).
pub fn arrivals_ms(n: usize, rate: f64, burstiness: f64, seed: u64) -> Result<Vec<f64>> {
    if rate.is_infinite() {
        return Ok(vec![0.; n]);
    }
    let bad = |what: &str| Error::Config(format!("{what}: give a positive number"));
    if rate.is_nan() || rate <= 0. {
        return Err(bad("--request-rate"));
    }
    if !(burstiness > 0. && burstiness.is_finite()) {
        return Err(bad("--burstiness"));
    }
    let mut r = rng(seed, ARRIVAL_STREAM);
    let mean_s = 1. / rate;
    // Poisson's exponential gaps, or gamma's of the same mean.
    let mut gap_s: Box<dyn FnMut(&mut ChaCha8Rng) -> f64> = if burstiness == 1. {
        let exp = Exp::new(rate).map_err(|_| bad("--request-rate"))?;
        Box::new(move |r| exp.sample(r))
    } else {
        let gamma = Gamma::new(burstiness, mean_s / burstiness).map_err(|_| bad("--burstiness"))?;
        Box::new(move |r| gamma.sample(r))
    };
    let mut t_ms = 0.;
    Ok((0..n)
        .map(|i| {
            if i > 0 {
                t_ms += gap_s(&mut r) * 1e3;
            }
            t_ms
        })
        .collect())
}

/// The run's requests in schedule order: arrival times and lengths from the seed.
pub fn schedule(load: &LoadSpec) -> Result<Vec<Planned>> {
    let times = arrivals_ms(
        load.num_requests,
        load.request_rate,
        load.burstiness,
        load.seed,
    )?;
    let mut r = rng(load.seed, LENGTH_STREAM);
    Ok(times
        .into_iter()
        .map(|scheduled_ms| Planned {
            scheduled_ms,
            input_len: load.input_len.draw(&mut r),
            output_len: load.output_len.draw(&mut r),
        })
        .collect())
}

/// Random prompts of the given lengths: token ids uniform over `0..vocab`, never one of
/// `banned` (the pad and EOS ids), from the seed.
pub fn prompts(lens: &[usize], vocab: usize, banned: &[u32], seed: u64) -> Vec<Vec<u32>> {
    let mut r = rng(seed, PROMPT_STREAM);
    lens.iter()
        .map(|&n| {
            (0..n)
                .map(|_| loop {
                    let id = r.random_range(0..vocab as u32);
                    if !banned.contains(&id) {
                        break id;
                    }
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(seed: u64) -> LoadSpec {
        LoadSpec {
            num_requests: 50,
            request_rate: 4.,
            burstiness: 1.,
            max_concurrency: None,
            input_len: LenRange::parse("64:256", "--input-len").unwrap(),
            output_len: LenRange::parse("16", "--output-len").unwrap(),
            seed,
        }
    }

    /// Mean rate of arrival times: gaps / time of the last arrival, requests/s.
    fn rate_of(times: &[f64]) -> f64 {
        (times.len() - 1) as f64 / (times.last().unwrap() / 1e3)
    }

    #[test]
    fn the_seed_fixes_the_schedule() {
        let a = schedule(&load(7)).unwrap();
        assert_eq!(a, schedule(&load(7)).unwrap(), "same seed, same schedule");
        assert_ne!(
            a,
            schedule(&load(8)).unwrap(),
            "another seed, another schedule"
        );
        assert_eq!(a[0].scheduled_ms, 0.);
        assert!(a.windows(2).all(|w| w[0].scheduled_ms <= w[1].scheduled_ms));
        assert!(a.iter().all(|p| (64..=256).contains(&p.input_len)));
        assert!(a.iter().all(|p| p.output_len == 16));
        // Lengths do vary over the range.
        assert!(a.iter().any(|p| p.input_len != a[0].input_len));
        let p = prompts(&[5, 9], 50257, &[50256], 7);
        assert_eq!(p, prompts(&[5, 9], 50257, &[50256], 7));
        assert_eq!((p[0].len(), p[1].len()), (5, 9));
    }

    /// 20 000 gaps: the sample mean's relative standard error is 1/√(B·n), under 1 % for
    /// B ≥ 0.5, so 5 % holds with room (and the seed fixes the draw).
    #[test]
    fn arrivals_have_the_requested_mean_rate() {
        let n = 20_001;
        for burstiness in [0.5, 1., 2., 4.] {
            for rate in [2., 50.] {
                let got = rate_of(&arrivals_ms(n, rate, burstiness, 3).unwrap());
                assert!(
                    (got / rate - 1.).abs() < 0.05,
                    "B {burstiness} R {rate}: {got}"
                );
            }
        }
    }

    /// Burstiness 1 (the Poisson process's exponential gaps) against a gamma of shape 1 drawn
    /// by hand: both have mean 1 / R.
    #[test]
    fn gamma_of_burstiness_one_has_poisson_s_mean() {
        let (n, rate) = (20_001, 10.);
        let poisson = rate_of(&arrivals_ms(n, rate, 1., 5).unwrap());
        let gamma = Gamma::new(1., 1. / rate).unwrap();
        let mut r = ChaCha8Rng::seed_from_u64(5);
        let mean_gap: f64 = (1..n).map(|_| gamma.sample(&mut r)).sum::<f64>() / (n - 1) as f64;
        assert!(
            (poisson * mean_gap - 1.).abs() < 0.05,
            "{poisson} {mean_gap}"
        );
        assert!(
            (rate_of(&arrivals_ms(n, rate, 1. + 1e-9, 5).unwrap()) / poisson - 1.).abs() < 0.05
        );
    }

    #[test]
    fn an_infinite_rate_sends_everything_at_once_and_bad_input_is_refused() {
        assert_eq!(arrivals_ms(3, f64::INFINITY, 1., 0).unwrap(), [0.; 3]);
        assert!(arrivals_ms(3, 0., 1., 0).is_err());
        assert!(arrivals_ms(3, 1., 0., 0).is_err());
        for bad in ["0", "x", "9:3", "1:", ":4"] {
            let e = LenRange::parse(bad, "--input-len").unwrap_err().to_string();
            assert!(e.contains("expected N or A:B"), "{e}");
        }
        assert_eq!(
            LenRange::parse("8", "--input-len").unwrap(),
            LenRange { min: 8, max: 8 }
        );
    }
}
