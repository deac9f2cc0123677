//! Continuous (in-flight) batching (`--batching continuous`, the default): the engine holds
//! `--batch-size` slots; between two decode steps every request that has arrived joins a free
//! slot (first come, first served; its prompt prefilled alone, one prefill at a time, which
//! gives its first token), then one decode step runs over every occupied slot, giving each
//! its next token; a request leaves its slot at its last token, and the next arrival may take
//! the slot before the next step. As vLLM's scheduler without chunked prefill: prefills go
//! first, so a join delays the running requests' next token by its prefill.
//!
//! Times, ms on the scenario's [`Clock`]: a request's `start_ms` is its prefill's start, its
//! first token the prefill's end, each later token the end of the decode step that made it
//! (the engine returns with the ids on the host, the device done), its finish its last token.
//! `batch` is the decode step it first takes part in (the steps before its join), `batch_size`
//! the slots occupied once it joined, itself included. The queue and `--max-concurrency` are
//! static batching's ([`Queue`]): a place frees when its request finishes.

use super::load::Planned;
use super::queue::{Clock, Policy, Queue, Served};
use crate::error::{Error, Result};
use crate::record::RequestRecord;

/// The engine as continuous batching drives it; every call returns when its work is done
/// (the clock then reads its end).
pub trait Stepper {
    /// Prefills request `request`'s prompt into the free slot `slot` (its first token).
    fn join(&mut self, slot: usize, request: usize, clock: &mut dyn Clock) -> Result<()>;
    /// One decode step of every occupied slot; returns the tokens made (one a slot).
    fn step(&mut self, clock: &mut dyn Clock) -> Result<usize>;
    /// Frees `slot`.
    fn leave(&mut self, slot: usize) -> Result<()>;
}

/// A request in a slot, its times so far.
struct Active {
    request: usize,
    arrival_ms: f64,
    start_ms: f64,
    batch: usize,
    batch_size: usize,
    token_ms: Vec<f64>,
}

/// [`super::queue::serve`]'s contract under continuous batching: serves every request of
/// `plan` through `engine`, `done` handed the records of the requests that finish together
/// (after one prefill or one step) as they finish. `n_batches` counts decode steps,
/// `batch_size_mean` is their mean occupied slots.
pub fn serve_continuous(
    plan: &[Planned],
    policy: Policy,
    clock: &mut dyn Clock,
    engine: &mut dyn Stepper,
    done: &mut dyn FnMut(&[RequestRecord]) -> Result<()>,
) -> Result<Served> {
    let mut run = Run {
        q: Queue::new(plan, policy),
        slots: (0..policy.max_batch.max(1)).map(|_| None).collect(),
        served: Served {
            records: vec![],
            n_batches: 0,
            failure: None,
            batch_size_mean: None,
        },
        rows: 0,
    };
    while run.served.records.len() < plan.len() {
        run.q.send_until(clock.now_ms());
        if run.slots.iter().all(Option::is_none) && run.q.waiting.is_empty() {
            // Nothing in flight: the next request's time is the next event.
            clock.sleep_until_ms(plan[run.q.next].scheduled_ms);
            continue;
        }
        if let Err(e) = run.round(clock, engine, done) {
            run.served.failure = Some(e);
            break;
        }
    }
    let mut served = run.served;
    served.batch_size_mean = Some(match served.n_batches {
        0 => f64::NAN,
        n => run.rows as f64 / n as f64,
    });
    Ok(served)
}

/// The scheduler's state: the queue, the slots, what is served.
struct Run<'p> {
    q: Queue<'p>,
    slots: Vec<Option<Active>>,
    served: Served,
    /// Occupied slots summed over the decode steps.
    rows: usize,
}

impl Run<'_> {
    /// The joins, then one decode step where a slot is occupied; requests leave after each.
    fn round(
        &mut self,
        clock: &mut dyn Clock,
        engine: &mut dyn Stepper,
        done: &mut dyn FnMut(&[RequestRecord]) -> Result<()>,
    ) -> Result<()> {
        self.join_waiting(clock, engine)?;
        self.leave_done(engine, clock.now_ms(), done)?; // one-token requests
        let occupied = self.slots.iter().flatten().count();
        if occupied == 0 {
            return Ok(());
        }
        let made = engine.step(clock)?;
        if made != occupied {
            return Err(Error::Engine(format!(
                "a decode step over {occupied} occupied slots made {made} tokens"
            )));
        }
        let t = clock.now_ms();
        self.slots
            .iter_mut()
            .flatten()
            .for_each(|a| a.token_ms.push(t));
        self.served.n_batches += 1;
        self.rows += occupied;
        self.leave_done(engine, t, done)
    }

    /// Every waiting request that has a free slot joins it, first come first, one prefill
    /// after the other; requests arriving during a prefill may join in the same round.
    fn join_waiting(&mut self, clock: &mut dyn Clock, engine: &mut dyn Stepper) -> Result<()> {
        while let Some(slot) = self.slots.iter().position(Option::is_none) {
            let Some((request, arrival_ms)) = self.q.waiting.pop_front() else {
                break;
            };
            let start_ms = clock.now_ms();
            engine.join(slot, request, clock)?;
            let first = clock.now_ms();
            self.slots[slot] = Some(Active {
                request,
                arrival_ms,
                start_ms,
                batch: self.served.n_batches,
                batch_size: self.slots.iter().flatten().count() + 1,
                token_ms: vec![first],
            });
            self.q.send_until(first);
        }
        Ok(())
    }

    /// The requests with all their tokens leave their slots at `t_ms`; their records go to
    /// `done`, then to the served.
    fn leave_done(
        &mut self,
        engine: &mut dyn Stepper,
        t_ms: f64,
        done: &mut dyn FnMut(&[RequestRecord]) -> Result<()>,
    ) -> Result<()> {
        let plan = self.q.plan;
        let mut records = vec![];
        for (slot, a) in self.slots.iter_mut().enumerate() {
            let Some(active) = a.take_if(|a| a.token_ms.len() >= plan[a.request].output_len) else {
                continue;
            };
            engine.leave(slot)?;
            let p = &plan[active.request];
            let last = *active.token_ms.last().expect("a first token");
            records.push(RequestRecord {
                request: active.request,
                batch: active.batch,
                batch_size: active.batch_size,
                scheduled_ms: p.scheduled_ms,
                arrival_ms: active.arrival_ms,
                start_ms: active.start_ms,
                first_token_ms: active.token_ms[0],
                finish_ms: last,
                token_ms: active.token_ms,
                input_len: p.input_len,
                output_len: p.output_len,
            });
        }
        if !records.is_empty() {
            // Requests scheduled by now entered the queue then, where there was room.
            self.q.send_until(t_ms);
            self.q.finished(records.len(), t_ms);
            done(&records)?;
            self.served.records.extend(records);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::serving::queue::tests::{ordered, plan, StepClock};

    /// A fake engine on the fake clock: a prefill takes `prefill` ms, a decode step 1 ms;
    /// it checks the slots are used as the trait says, and fails at step `fail_at`.
    struct Fake {
        prefill: f64,
        taken: Vec<bool>,
        steps: usize,
        fail_at: Option<usize>,
    }

    impl Fake {
        fn new(slots: usize, prefill: f64) -> Self {
            Self {
                prefill,
                taken: vec![false; slots],
                steps: 0,
                fail_at: None,
            }
        }
    }

    impl Stepper for Fake {
        fn join(&mut self, slot: usize, _: usize, clock: &mut dyn Clock) -> Result<()> {
            assert!(!self.taken[slot], "slot {slot} joined twice");
            self.taken[slot] = true;
            let t = clock.now_ms() + self.prefill;
            clock.sleep_until_ms(t);
            Ok(())
        }

        fn step(&mut self, clock: &mut dyn Clock) -> Result<usize> {
            if self.fail_at == Some(self.steps) {
                return Err(Error::Engine("out of memory".into()));
            }
            self.steps += 1;
            let t = clock.now_ms() + 1.;
            clock.sleep_until_ms(t);
            Ok(self.taken.iter().filter(|&&t| t).count())
        }

        fn leave(&mut self, slot: usize) -> Result<()> {
            assert!(self.taken[slot], "slot {slot} left empty");
            self.taken[slot] = false;
            Ok(())
        }
    }

    fn run(plan: &[Planned], policy: Policy, engine: &mut Fake) -> Served {
        let mut clock = StepClock(0.);
        let mut handed = vec![];
        let mut done = |r: &[RequestRecord]| {
            handed.extend(r.iter().map(|r| r.request));
            Ok(())
        };
        let s = serve_continuous(plan, policy, &mut clock, engine, &mut done).unwrap();
        let served: Vec<usize> = s.records.iter().map(|r| r.request).collect();
        assert_eq!(handed, served, "every record handed over once, as served");
        s
    }

    fn open(max_batch: usize) -> Policy {
        Policy {
            max_batch,
            max_concurrency: None,
        }
    }

    #[test]
    fn an_arrival_joins_before_the_next_step_and_delays_it_by_its_prefill() {
        // 0 runs alone; 1 arrives at 6.5, during step 2 (6 -> 7), and joins at 7.
        let p = plan(&[0., 6.5], 4);
        let s = run(&p, open(8), &mut Fake::new(8, 5.));
        let (r0, r1) = (&s.records[0], &s.records[1]);
        assert_eq!((r0.request, r1.request), (0, 1), "0 finishes first");
        assert_eq!(
            r0.token_ms,
            [5., 6., 7., 13.],
            "its 4th token waited for 1's prefill"
        );
        assert_eq!(r0.finish_ms, 13., "it leaves at its last token");
        assert_eq!(
            (r1.arrival_ms, r1.start_ms, r1.first_token_ms),
            (6.5, 7., 12.)
        );
        assert_eq!(r1.token_ms, [12., 13., 14., 15.]);
        assert_eq!(
            (r1.batch, r1.batch_size),
            (2, 2),
            "joins before step 2, beside 0"
        );
        assert_eq!((r0.batch, r0.batch_size), (0, 1));
        assert_eq!(s.n_batches, 5);
        assert_eq!(s.batch_size_mean, Some((1. + 1. + 2. + 1. + 1.) / 5.));
        assert!(s.records.iter().all(ordered));
    }

    #[test]
    fn arrivals_during_a_prefill_join_in_the_same_round_and_a_freed_slot_is_taken_at_once() {
        // Three slots: 0 joins at 0; 1 and 2 arrive during its prefill and join before the
        // first step; 3 (at 3) waits for a slot, which 1 (2 tokens) frees after that step.
        let mut p = plan(&[0., 1., 2., 3.], 3);
        p[1].output_len = 2;
        let s = run(&p, open(3), &mut Fake::new(3, 5.));
        let by = |i: usize| s.records.iter().find(|r| r.request == i).unwrap();
        assert_eq!((by(1).start_ms, by(2).start_ms), (5., 10.));
        assert_eq!(by(2).batch_size, 3);
        assert_eq!(
            by(1).token_ms,
            [10., 16.],
            "its 2nd token: the first step, after 2's prefill"
        );
        assert_eq!((by(3).start_ms, by(3).batch, by(3).batch_size), (16., 1, 3));
        assert_eq!(by(0).token_ms, [5., 16., 22.], "3's prefill came between");
        assert!(s.records.iter().all(ordered));
        // One slot: the requests one after the other, as static batching of 1.
        let one = run(&plan(&[0., 0.], 2), open(1), &mut Fake::new(1, 5.));
        assert_eq!(
            one.records[1].start_ms, 6.,
            "the slot is free at 0's last token"
        );
    }

    #[test]
    fn a_one_token_request_leaves_after_its_prefill() {
        let p = plan(&[0., 0.], 1);
        let s = run(&p, open(4), &mut Fake::new(4, 5.));
        assert_eq!(s.n_batches, 0, "no decode step");
        let finish: Vec<f64> = s.records.iter().map(|r| r.finish_ms).collect();
        assert_eq!(finish, [5., 10.]);
        assert!(s.batch_size_mean.unwrap().is_nan());
    }

    #[test]
    fn a_closed_loop_never_exceeds_its_concurrency() {
        let p = plan(&[0.; 30], 4);
        for (cap, slots) in [(1, 8), (3, 8), (4, 2), (8, 3)] {
            let policy = Policy {
                max_batch: slots,
                max_concurrency: Some(cap),
            };
            let s = run(&p, policy, &mut Fake::new(slots, 2.));
            assert_eq!(s.records.len(), 30);
            assert!(s.records.iter().all(ordered));
            for t in s.records.iter().map(|r| r.arrival_ms) {
                let in_flight = (s.records.iter())
                    .filter(|r| r.arrival_ms <= t && t < r.finish_ms)
                    .count();
                assert!(in_flight <= cap, "cap {cap}: {in_flight} in flight at {t}");
            }
            assert!(s.records.iter().all(|r| r.batch_size <= slots.min(cap)));
        }
    }

    #[test]
    fn a_failing_step_ends_the_run_with_the_finished_requests() {
        let p = plan(&[0., 0., 50.], 2);
        let mut engine = Fake::new(2, 1.);
        engine.fail_at = Some(1);
        let s = run(&p, open(1), &mut engine);
        let err = s.failure.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("out of memory"), "{err}");
        let served: Vec<usize> = s.records.iter().map(|r| r.request).collect();
        assert_eq!(
            served,
            [0],
            "request 0 finished at step 0; 1 failed at step 1"
        );
    }
}
