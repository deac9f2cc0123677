//! The serving suite's metrics, each defined once, with vLLM's `benchmark_serving` meanings;
//! every time is in ms on the scenario's clock ([`RequestRecord`]):
//!
//! - TTFT = first token − arrival (queueing included: what a client waits);
//! - TPOT = (finish − first token) / (output tokens − 1), per request with more than one
//!   output token (the first token excluded);
//! - ITL = the gaps between consecutive output tokens, every request;
//! - E2E = finish − arrival; queue = start − arrival;
//! - duration = the last finish (the clock starts at 0, the first arrival's earliest time);
//! - request throughput = requests / duration; output tokens/s = output tokens / duration;
//! - goodput = requests meeting every limit of `--slo` / duration.

use super::percentile;
use crate::error::{message_without_backtrace, Error, Result};
use crate::record::{Percentiles, RequestRecord, RunStatus, ServingSummary};
use crate::trackers::{peak_rss_bytes, MemoryReading};

/// `--slo ttft_ms=X,tpot_ms=Y`: a request is good when its TTFT is at most X ms and its TPOT at
/// most Y ms (either limit may be left out; a request without TPOT meets any TPOT limit).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

const SLO_FORM: &str = "expected ttft_ms=X,tpot_ms=Y (milliseconds, one or both)";

impl Slo {
    /// Parses `ttft_ms=X,tpot_ms=Y`; a one-line error naming the form otherwise.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || Error::Config(format!("--slo '{text}': {SLO_FORM}"));
        let mut slo = Slo::default();
        for part in text.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(bad)?;
            let ms: f64 = value.trim().parse().map_err(|_| bad())?;
            if !(ms.is_finite() && ms >= 0.) {
                return Err(bad());
            }
            let slot = match key.trim() {
                "ttft_ms" => &mut slo.ttft_ms,
                "tpot_ms" => &mut slo.tpot_ms,
                _ => return Err(bad()),
            };
            if slot.replace(ms).is_some() {
                return Err(bad());
            }
        }
        Ok(slo)
    }

    /// Whether request `r` meets every limit.
    pub fn met(&self, r: &RequestRecord) -> bool {
        let ttft_ok = self.ttft_ms.is_none_or(|x| ttft_ms(r) <= x);
        let tpot_ok = match (self.tpot_ms, tpot_ms(r)) {
            (Some(y), Some(t)) => t <= y,
            _ => true,
        };
        ttft_ok && tpot_ok
    }
}

pub fn ttft_ms(r: &RequestRecord) -> f64 {
    r.first_token_ms - r.arrival_ms
}

/// None for a request of one output token.
pub fn tpot_ms(r: &RequestRecord) -> Option<f64> {
    (r.output_len > 1).then(|| (r.finish_ms - r.first_token_ms) / (r.output_len - 1) as f64)
}

pub fn e2e_ms(r: &RequestRecord) -> f64 {
    r.finish_ms - r.arrival_ms
}

pub fn itl_ms(r: &RequestRecord) -> impl Iterator<Item = f64> + '_ {
    r.token_ms.windows(2).map(|w| w[1] - w[0])
}

/// Mean and percentiles of `values` (NaN where empty).
pub fn percentiles(values: &[f64]) -> Percentiles {
    if values.is_empty() {
        let nan = f64::NAN;
        return Percentiles {
            mean: nan,
            p50: nan,
            p90: nan,
            p99: nan,
        };
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Percentiles {
        mean: values.iter().sum::<f64>() / values.len() as f64,
        p50: percentile(&sorted, 50.),
        p90: percentile(&sorted, 90.),
        p99: percentile(&sorted, 99.),
    }
}

/// What a serving run ended with, besides its requests.
pub struct ServingEnd {
    /// Engine calls made (continuous batching: decode steps).
    pub n_batches: usize,
    /// Continuous batching: the mean occupied slots of a decode step; None: requests per call.
    pub batch_size_mean: Option<f64>,
    /// The error that ended the run early.
    pub failure: Option<String>,
    pub wall_seconds: f64,
    pub memory: MemoryReading,
}

/// The summary of the served `requests` (see the module's formulas).
pub fn summary(requests: &[RequestRecord], slo: Option<&Slo>, end: ServingEnd) -> ServingSummary {
    let of = |f: &dyn Fn(&RequestRecord) -> f64| requests.iter().map(f).collect::<Vec<f64>>();
    let duration = requests.iter().map(|r| r.finish_ms).fold(0., f64::max) / 1e3;
    let rate = |n: usize| match duration > 0. {
        true => n as f64 / duration,
        false => f64::NAN,
    };
    let output: usize = requests.iter().map(|r| r.output_len).sum();
    let met = slo.map(|s| requests.iter().filter(|r| s.met(r)).count());
    let tpot: Vec<f64> = requests.iter().filter_map(tpot_ms).collect();
    let itl: Vec<f64> = requests.iter().flat_map(itl_ms).collect();
    ServingSummary {
        status: RunStatus::of_result(end.failure.as_deref()),
        error: end.failure.as_deref().map(message_without_backtrace),
        n_requests: requests.len(),
        n_batches: end.n_batches,
        total_input_tokens: requests.iter().map(|r| r.input_len).sum(),
        total_output_tokens: output,
        duration_seconds: duration,
        requests_per_second: rate(requests.len()),
        output_tokens_per_second: rate(output),
        goodput_requests_per_second: met.map(rate),
        slo_met_requests: met,
        batch_size_mean: end
            .batch_size_mean
            .unwrap_or(requests.len() as f64 / end.n_batches.max(1) as f64),
        ttft_ms: percentiles(&of(&ttft_ms)),
        tpot_ms: percentiles(&tpot),
        itl_ms: percentiles(&itl),
        e2e_ms: percentiles(&of(&e2e_ms)),
        queue_ms: percentiles(&of(&|r| r.start_ms - r.arrival_ms)),
        wall_seconds: end.wall_seconds,
        peak_memory_bytes: end.memory.peak_bytes,
        peak_host_memory_bytes: peak_rss_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request of `out` tokens arriving at 0, its first token at `first`, one token a ms.
    fn request(first: f64, out: usize) -> RequestRecord {
        let token_ms: Vec<f64> = (0..out).map(|i| first + i as f64).collect();
        RequestRecord {
            request: 0,
            batch: 0,
            batch_size: 1,
            scheduled_ms: 0.,
            arrival_ms: 0.,
            start_ms: 0.,
            first_token_ms: first,
            finish_ms: *token_ms.last().unwrap(),
            token_ms,
            input_len: 8,
            output_len: out,
        }
    }

    fn end(n_batches: usize) -> ServingEnd {
        ServingEnd {
            n_batches,
            batch_size_mean: None,
            failure: None,
            wall_seconds: 1.,
            memory: MemoryReading::default(),
        }
    }

    #[test]
    fn the_latencies_follow_their_definitions() {
        let r = request(10., 5);
        assert_eq!((ttft_ms(&r), tpot_ms(&r), e2e_ms(&r)), (10., Some(1.), 14.));
        assert_eq!(itl_ms(&r).collect::<Vec<_>>(), [1.; 4]);
        assert_eq!(tpot_ms(&request(10., 1)), None, "one token: no TPOT");
        let s = summary(&[r.clone(), request(20., 5)], None, end(2));
        assert_eq!((s.n_requests, s.total_output_tokens), (2, 10));
        assert_eq!(s.duration_seconds, 0.024);
        assert_eq!(s.requests_per_second, 2. / 0.024);
        assert_eq!((s.ttft_ms.p50, s.ttft_ms.mean), (15., 15.));
        assert_eq!(s.goodput_requests_per_second, None);
    }

    #[test]
    fn goodput_counts_the_requests_within_the_slo() {
        let reqs = [request(10., 5), request(20., 5)];
        let slo = |t, p| Slo {
            ttft_ms: Some(t),
            tpot_ms: Some(p),
        };
        let good = |s: Slo| summary(&reqs, Some(&s), end(1));
        let none = good(slo(0., 0.));
        assert_eq!(
            (none.goodput_requests_per_second, none.slo_met_requests),
            (Some(0.), Some(0))
        );
        let all = good(slo(1e9, 1e9));
        assert_eq!(
            all.goodput_requests_per_second,
            Some(all.requests_per_second)
        );
        assert_eq!(good(slo(15., 1.)).slo_met_requests, Some(1));
    }

    #[test]
    fn slo_parses_its_one_form() {
        let s = Slo::parse("ttft_ms=200,tpot_ms=20").unwrap();
        assert_eq!((s.ttft_ms, s.tpot_ms), (Some(200.), Some(20.)));
        assert_eq!(Slo::parse("tpot_ms=5").unwrap().ttft_ms, None);
        for bad in [
            "",
            "ttft=200",
            "ttft_ms=x",
            "ttft_ms=-1",
            "ttft_ms=1,ttft_ms=2",
            "200",
        ] {
            let e = Slo::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("expected ttft_ms=X,tpot_ms=Y") && !e.contains('\n'),
                "{e}"
            );
        }
    }
}
