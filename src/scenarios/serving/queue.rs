//! Static batching of arrived requests: each time the engine is free, the requests that have
//! arrived (first come, first served, `--batch-size` at most) go to it as one generation call;
//! requests arriving meanwhile wait for the next call (`--batching static`). Continuous
//! batching (requests joining and leaving at every decode step) is [`super::continuous`].
//!
//! Time is a [`Clock`] of ms from 0: the wall clock in a run, a clock that moves only when
//! told to in the tests (so the order of events is checked, never the machine's speed).
//! Under `--max-concurrency C` a request enters the queue at its scheduled time or, when C
//! requests are in flight then, when a call returns and frees their places (closed loop).

use super::load::Planned;
use crate::error::{Error, Result};
use crate::record::RequestRecord;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The scenario's clock, ms from its 0.
pub trait Clock {
    fn now_ms(&self) -> f64;
    /// Returns at `t_ms` or later (at once when it has passed).
    fn sleep_until_ms(&mut self, t_ms: f64);
}

/// Real time since the clock was made.
pub struct WallClock(Instant);

impl WallClock {
    pub fn start() -> Self {
        Self(Instant::now())
    }
}

impl Clock for WallClock {
    fn now_ms(&self) -> f64 {
        self.0.elapsed().as_secs_f64() * 1e3
    }

    fn sleep_until_ms(&mut self, t_ms: f64) {
        let wait = t_ms - self.now_ms();
        if wait > 0. {
            std::thread::sleep(Duration::from_secs_f64(wait / 1e3));
        }
    }
}

/// How the queue hands requests to the engine.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Requests per call at most (`--batch-size`).
    pub max_batch: usize,
    /// Requests in flight at most (`--max-concurrency`); None: open loop.
    pub max_concurrency: Option<usize>,
}

/// One engine call: the requests (indices into the schedule) to generate for, run on `clock`;
/// returns each step's time after the call's start, ms (one per output token of the longest
/// output asked).
pub type Call<'a> = dyn FnMut(&[usize], &mut dyn Clock) -> Result<Vec<f64>> + 'a;

/// What [`serve`] did: every request served, in the order served; the calls made; the error
/// that stopped it.
pub struct Served {
    pub records: Vec<RequestRecord>,
    pub n_batches: usize,
    pub failure: Option<Error>,
    /// Continuous batching: the mean occupied slots of its decode steps; None: requests per
    /// call.
    pub batch_size_mean: Option<f64>,
}

impl Served {
    /// Nothing served: `failure` came first (the warm-up's, or the engine's set-up).
    pub fn failed(failure: Error) -> Self {
        Self {
            records: vec![],
            n_batches: 0,
            failure: Some(failure),
            batch_size_mean: None,
        }
    }
}

/// The queue's state: who has been sent, who waits, how many are in flight (static batching
/// here, continuous batching in [`super::continuous`]).
pub(super) struct Queue<'p> {
    pub(super) plan: &'p [Planned],
    policy: Policy,
    /// Next request of the schedule not yet sent.
    pub(super) next: usize,
    /// (request, arrival ms), first come first.
    pub(super) waiting: VecDeque<(usize, f64)>,
    in_flight: usize,
    /// When places last freed (a call's return): the earliest arrival of a request held back.
    freed_ms: f64,
}

impl<'p> Queue<'p> {
    pub(super) fn new(plan: &'p [Planned], policy: Policy) -> Self {
        Self {
            plan,
            policy,
            next: 0,
            waiting: VecDeque::new(),
            in_flight: 0,
            freed_ms: 0.,
        }
    }

    /// `n` requests in flight finished at `t_ms`: their places are free from then on.
    pub(super) fn finished(&mut self, n: usize, t_ms: f64) {
        self.in_flight -= n;
        self.freed_ms = t_ms;
    }

    /// Sends the requests scheduled by `t_ms` while the concurrency allows.
    pub(super) fn send_until(&mut self, t_ms: f64) {
        let cap = self.policy.max_concurrency.unwrap_or(usize::MAX);
        while self.next < self.plan.len()
            && self.plan[self.next].scheduled_ms <= t_ms
            && self.in_flight < cap
        {
            let arrival = self.plan[self.next].scheduled_ms.max(self.freed_ms);
            self.waiting.push_back((self.next, arrival));
            self.in_flight += 1;
            self.next += 1;
        }
    }
}

/// Serves every request of `plan` through `call`, batching as the module says; `done` is
/// handed each call's records as it returns (the log writes them).
pub fn serve(
    plan: &[Planned],
    policy: Policy,
    clock: &mut dyn Clock,
    call: &mut Call,
    done: &mut dyn FnMut(&[RequestRecord]) -> Result<()>,
) -> Result<Served> {
    let mut q = Queue::new(plan, policy);
    let mut served = Served {
        records: vec![],
        n_batches: 0,
        failure: None,
        batch_size_mean: None,
    };
    while served.records.len() < plan.len() {
        q.send_until(clock.now_ms());
        if q.waiting.is_empty() {
            // Nothing in flight: the next request's time is the next event.
            clock.sleep_until_ms(plan[q.next].scheduled_ms);
            continue;
        }
        let take = q.waiting.len().min(policy.max_batch.max(1));
        let batch: Vec<(usize, f64)> = q.waiting.drain(..take).collect();
        let ids: Vec<usize> = batch.iter().map(|b| b.0).collect();
        let start_ms = clock.now_ms();
        let laps = match call(&ids, clock) {
            Ok(laps) => laps,
            Err(e) => {
                served.failure = Some(e);
                break;
            }
        };
        let finish_ms = clock.now_ms();
        // Requests scheduled during the call entered the queue then, where there was room.
        q.send_until(finish_ms);
        q.finished(batch.len(), finish_ms);
        let times = (served.n_batches, start_ms, finish_ms);
        let records = records(plan, &batch, &laps, times)?;
        done(&records)?;
        served.records.extend(records);
        served.n_batches += 1;
    }
    Ok(served)
}

/// The records of one call: `laps` (ms after `start_ms`) are the batch's steps, each request
/// taking the first `output_len` of them.
fn records(
    plan: &[Planned],
    batch: &[(usize, f64)],
    laps: &[f64],
    (index, start_ms, finish_ms): (usize, f64, f64),
) -> Result<Vec<RequestRecord>> {
    batch
        .iter()
        .map(|&(request, arrival_ms)| {
            let p = &plan[request];
            if laps.len() < p.output_len {
                return Err(Error::Engine(format!(
                    "the engine timed {} steps for a request of {} output tokens",
                    laps.len(),
                    p.output_len
                )));
            }
            let token_ms: Vec<f64> = laps[..p.output_len].iter().map(|l| start_ms + l).collect();
            Ok(RequestRecord {
                request,
                batch: index,
                batch_size: batch.len(),
                scheduled_ms: p.scheduled_ms,
                arrival_ms,
                start_ms,
                first_token_ms: token_ms[0],
                // The call returned after its last step: never before a token it timed.
                finish_ms: finish_ms.max(*token_ms.last().expect("output_len >= 1")),
                token_ms,
                input_len: p.input_len,
                output_len: p.output_len,
            })
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A clock that moves only when slept on or stepped by the fake engine.
    pub(crate) struct StepClock(pub(crate) f64);

    impl Clock for StepClock {
        fn now_ms(&self) -> f64 {
            self.0
        }
        fn sleep_until_ms(&mut self, t_ms: f64) {
            self.0 = self.0.max(t_ms);
        }
    }

    /// A fake engine: `prefill` ms to the first token, then 1 ms a token, for the longest
    /// output of the batch.
    fn engine<'a>(plan: &'a [Planned], prefill: f64) -> Box<Call<'a>> {
        Box::new(move |ids: &[usize], clock: &mut dyn Clock| {
            let n = ids.iter().map(|&i| plan[i].output_len).max().unwrap();
            let laps: Vec<f64> = (0..n).map(|k| prefill + k as f64).collect();
            let now = clock.now_ms();
            clock.sleep_until_ms(now + laps[n - 1]);
            Ok(laps)
        })
    }

    pub(crate) fn plan(times: &[f64], out: usize) -> Vec<Planned> {
        times
            .iter()
            .map(|&t| Planned {
                scheduled_ms: t,
                input_len: 4,
                output_len: out,
            })
            .collect()
    }

    fn run(plan: &[Planned], policy: Policy) -> Served {
        let mut clock = StepClock(0.);
        let mut calls = 0;
        let mut done = |r: &[RequestRecord]| {
            calls += r.len();
            Ok(())
        };
        let s = serve(plan, policy, &mut clock, &mut *engine(plan, 5.), &mut done).unwrap();
        assert_eq!(calls, plan.len(), "every record handed over once");
        s
    }

    pub(crate) fn ordered(r: &RequestRecord) -> bool {
        r.scheduled_ms <= r.arrival_ms
            && r.arrival_ms <= r.start_ms
            && r.start_ms <= r.first_token_ms
            && r.token_ms.windows(2).all(|w| w[0] <= w[1])
            && *r.token_ms.last().unwrap() <= r.finish_ms
    }

    #[test]
    fn a_call_takes_what_has_arrived_up_to_the_batch_size() {
        // 0, 1, 2 arrive together-ish; the first call (at 0) takes request 0 alone, the
        // second the two that arrived during it; 3 arrives after, alone.
        let p = plan(&[0., 1., 2., 100.], 3);
        let open = Policy {
            max_batch: 8,
            max_concurrency: None,
        };
        let s = run(&p, open);
        let batches: Vec<(usize, usize)> = s.records.iter().map(|r| (r.request, r.batch)).collect();
        assert_eq!(batches, [(0, 0), (1, 1), (2, 1), (3, 2)]);
        assert!(s.records.iter().all(ordered));
        let r1 = &s.records[1];
        // Its call started when the first returned (0 + 5 + 2 ms), arrival as scheduled.
        assert_eq!(
            (r1.arrival_ms, r1.start_ms, r1.first_token_ms),
            (1., 7., 12.)
        );
        assert_eq!(
            s.records[3].start_ms, 100.,
            "an idle engine waits for the next arrival"
        );
        let small = run(
            &p,
            Policy {
                max_batch: 1,
                ..open
            },
        );
        assert_eq!(small.n_batches, 4);
    }

    #[test]
    fn a_closed_loop_never_exceeds_its_concurrency() {
        let p = plan(&[0.; 40], 4);
        for (cap, max_batch) in [(1, 8), (3, 8), (4, 2), (8, 3)] {
            let policy = Policy {
                max_batch,
                max_concurrency: Some(cap),
            };
            let s = run(&p, policy);
            assert_eq!(s.records.len(), 40);
            assert!(s.records.iter().all(ordered));
            // In flight at t: arrived at or before t, not yet finished.
            for t in s.records.iter().map(|r| r.arrival_ms) {
                let in_flight = s
                    .records
                    .iter()
                    .filter(|r| r.arrival_ms <= t && t < r.finish_ms)
                    .count();
                assert!(in_flight <= cap, "cap {cap}: {in_flight} in flight at {t}");
            }
            assert!(s.records.iter().all(|r| r.batch_size <= max_batch.min(cap)));
        }
    }
}
