//! Serving through an engine that replays the whole load on its own clock (the HF worker,
//! [`crate::engines::replay`]): the load handed over as the queue would serve it, and the
//! engine's raw times checked and made into the same [`RequestRecord`]s the in-process queue
//! makes ([`super::queue`]), so one summary's formulas serve both.

use super::load::Planned;
use crate::engines::replay::{ReplayLoad, ReplayRequest, Replayed, ReplayedRequest};
use crate::error::{Error, Result};
use crate::record::RequestRecord;

/// How the log header names transformers' continuous batching.
pub const CONTINUOUS: &str =
    "continuous: transformers' ContinuousBatchingManager, a paged KV cache; requests join and leave the running batch at every step";

/// The header's clock for a replayed load.
pub const CLOCK: &str = "wall time in the engine's process, ms, from the end of its warm-up (the first scheduled arrival); every token stamped on the host as the engine handed it over (static: device synchronized after each step)";

/// The load as the engine is handed it: request i of `plan` with its prompt `prompts[i]`,
/// under `rules` (its queue rules and warm-up; its own requests are replaced), at least one
/// request a call.
pub fn replay_load<'a>(
    plan: &[Planned],
    prompts: &'a [Vec<u32>],
    rules: ReplayLoad<'a>,
) -> ReplayLoad<'a> {
    let requests = plan
        .iter()
        .zip(prompts)
        .map(|(planned, prompt)| ReplayRequest {
            scheduled_ms: planned.scheduled_ms,
            prompt,
            output_len: planned.output_len,
        })
        .collect();
    ReplayLoad {
        requests,
        max_batch: rules.max_batch.max(1),
        ..rules
    }
}

/// The log's records of a replay, in the order served: each request's times checked against
/// its plan (served once, exactly `output_len` tokens, `scheduled ≤ arrival ≤ start ≤ first
/// token ≤ … ≤ last token ≤ finish`); every request of the plan unless the replay failed. An
/// engine that breaks a rule is a one-line error naming the request.
pub fn records(plan: &[Planned], replayed: &Replayed) -> Result<Vec<RequestRecord>> {
    let mut seen = vec![false; plan.len()];
    let records: Vec<RequestRecord> = replayed
        .requests
        .iter()
        .map(|r| {
            let bad = |what: String| {
                Error::Engine(format!(
                    "the engine's replay: request {}: {what}",
                    r.request
                ))
            };
            let p = plan
                .get(r.request)
                .ok_or_else(|| bad(format!("not in the load of {}", plan.len())))?;
            if std::mem::replace(&mut seen[r.request], true) {
                return Err(bad("served twice".into()));
            }
            check_times(r, p).map_err(bad)?;
            Ok(RequestRecord {
                request: r.request,
                batch: r.batch,
                batch_size: r.batch_size,
                scheduled_ms: p.scheduled_ms,
                // Within CLOCK_SLACK_MS of the plan's time (a float's round trip): the plan's.
                arrival_ms: r.arrival_ms.max(p.scheduled_ms),
                start_ms: r.start_ms,
                first_token_ms: r.token_ms[0],
                token_ms: r.token_ms.clone(),
                finish_ms: r.finish_ms,
                input_len: p.input_len,
                output_len: p.output_len,
            })
        })
        .collect::<Result<_>>()?;
    if replayed.failure.is_none() && records.len() < plan.len() {
        return Err(Error::Engine(format!(
            "the engine's replay served {} of {} requests and reported no error",
            records.len(),
            plan.len()
        )));
    }
    Ok(records)
}

/// How far a time may precede the one before it and still count as in order: the scheduled
/// times travel to the worker and back as text, and its arithmetic on them (the clock's origin
/// added, then taken off) moves them by an ulp (an H100 run: arrival 3649.037689091048 ms,
/// scheduled 3649.0376890910484).
const CLOCK_SLACK_MS: f64 = 1e-6;

/// The order of one request's times; what is wrong otherwise.
fn check_times(r: &ReplayedRequest, p: &Planned) -> std::result::Result<(), String> {
    if r.token_ms.len() != p.output_len {
        return Err(format!(
            "{} tokens timed for an output of {}",
            r.token_ms.len(),
            p.output_len
        ));
    }
    let times: Vec<(&str, f64)> = [
        ("scheduled", p.scheduled_ms),
        ("arrival", r.arrival_ms),
        ("start", r.start_ms),
    ]
    .into_iter()
    .chain(r.token_ms.iter().map(|&t| ("a token", t)))
    .chain([("finish", r.finish_ms)])
    .collect();
    if let Some(t) = times.iter().find(|t| !t.1.is_finite()) {
        return Err(format!("its {} time is {}", t.0, t.1));
    }
    match times.windows(2).find(|w| w[1].1 < w[0].1 - CLOCK_SLACK_MS) {
        Some(w) => Err(format!(
            "{} at {} ms before {} at {} ms",
            w[1].0, w[1].1, w[0].0, w[0].1
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::replay::{Batching, ReplayedRequest};
    use crate::engines::GenerateRequest;
    use crate::metrics::serving::{summary, ServingEnd};
    use crate::trackers::MemoryReading;

    fn plan() -> Vec<Planned> {
        [(0., 4), (12.5, 2)]
            .iter()
            .map(|&(scheduled_ms, output_len)| Planned {
                scheduled_ms,
                input_len: 3,
                output_len,
            })
            .collect()
    }

    /// The golden reply of `engines::hf::serve`'s test, as parsed: request 1 served first, alone.
    fn replayed() -> Replayed {
        let served = |request, batch, batch_size, times: (f64, f64, &[f64], f64)| ReplayedRequest {
            request,
            batch,
            batch_size,
            arrival_ms: times.0,
            start_ms: times.1,
            token_ms: times.2.to_vec(),
            finish_ms: times.3,
        };
        Replayed {
            mode: Batching::Continuous,
            requests: vec![
                served(1, 0, 1, (12.5, 12.75, &[14., 15.], 15.)),
                served(0, 1, 2, (0., 0.5, &[3., 4., 5., 6.], 6.25)),
            ],
            n_batches: 2,
            failure: None,
        }
    }

    #[test]
    fn a_replay_makes_the_queue_s_records_and_summary() {
        let recs = records(&plan(), &replayed()).unwrap();
        assert_eq!(recs.len(), 2);
        let r0 = &recs[1];
        assert_eq!(
            (r0.request, r0.batch, r0.batch_size, r0.scheduled_ms),
            (0, 1, 2, 0.)
        );
        assert_eq!((r0.first_token_ms, r0.finish_ms), (3., 6.25));
        assert_eq!((r0.input_len, r0.output_len), (3, 4));
        let end = ServingEnd {
            n_batches: 2,
            batch_size_mean: None,
            failure: None,
            wall_seconds: 1.,
            memory: MemoryReading::default(),
        };
        let s = summary(&recs, None, end);
        // TTFT: 3 - 0 and 14 - 12.5 (the median interpolated between the two); TPOT:
        // (6.25 - 3) / 3 and (15 - 14) / 1; duration: the last finish, 15 ms.
        assert_eq!(
            (s.ttft_ms.mean, s.ttft_ms.p50, s.ttft_ms.p99),
            (2.25, 2.25, 2.985)
        );
        assert_eq!(s.tpot_ms.mean, (3.25 / 3. + 1.) / 2.);
        assert_eq!(s.duration_seconds, 0.015);
        assert_eq!(s.requests_per_second, 2. / 0.015);
        assert_eq!((s.total_output_tokens, s.total_input_tokens), (6, 6));
        assert_eq!(s.queue_ms.mean, (0.5 + 0.25) / 2.);
        assert_eq!(s.batch_size_mean, 1.);
    }

    /// An arrival an ulp before its scheduled time (the worker's float round trip) is in
    /// order, and logged at the scheduled time; a microsecond before is not.
    #[test]
    fn an_arrival_an_ulp_early_is_the_scheduled_time() {
        let mut r = replayed(); // requests[0] is request 1, scheduled at 12.5 ms
        let scheduled = plan()[1].scheduled_ms;
        r.requests[0].arrival_ms = scheduled - scheduled * f64::EPSILON;
        assert!(r.requests[0].arrival_ms < scheduled);
        let got = records(&plan(), &r).unwrap();
        let one = got.iter().find(|g| g.request == 1).unwrap();
        assert_eq!(one.arrival_ms, scheduled);
        r.requests[0].arrival_ms = scheduled - 1e-3;
        assert!(records(&plan(), &r).is_err());
    }

    #[test]
    fn a_replay_that_breaks_a_rule_is_a_one_line_error() {
        type Edit = dyn Fn(&mut Vec<ReplayedRequest>);
        let with = |edit: &Edit| {
            let mut r = replayed();
            edit(&mut r.requests);
            records(&plan(), &r).unwrap_err().to_string()
        };
        let cases: [(&Edit, &str); 7] = [
            (
                &|r| r[0].token_ms.pop().map(drop).unwrap(),
                "1 tokens timed for an output of 2",
            ),
            (
                &|r| r[0].arrival_ms = 10.,
                "arrival at 10 ms before scheduled at 12.5 ms",
            ),
            (
                &|r| r[1].start_ms = -1.,
                "start at -1 ms before arrival at 0 ms",
            ),
            (
                &|r| r[1].token_ms[2] = 3.5,
                "a token at 3.5 ms before a token at 4 ms",
            ),
            (
                &|r| r[1].finish_ms = 5.,
                "finish at 5 ms before a token at 6 ms",
            ),
            (&|r| r[1].request = 1, "served twice"),
            (&|r| r[1].request = 7, "not in the load of 2"),
        ];
        for (edit, want) in cases {
            let e = with(edit);
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
        let e = with(&|r| r[1].finish_ms = f64::NAN);
        assert!(e.contains("its finish time is NaN"), "{e}");
        let e = with(&|r| drop(r.pop()));
        assert!(
            e.contains("served 1 of 2 requests and reported no error"),
            "{e}"
        );
        // A replay that failed keeps what it served.
        let mut failed = replayed();
        failed.requests.pop();
        failed.failure = Some("OutOfMemoryError".into());
        assert_eq!(records(&plan(), &failed).unwrap().len(), 1);
    }

    #[test]
    fn the_load_is_the_plan_with_its_prompts() {
        let (plan, prompts) = (plan(), vec![vec![5, 6, 7], vec![9, 9, 9]]);
        let warm = vec![vec![1, 2, 3]];
        let rules = ReplayLoad {
            requests: vec![],
            max_batch: 0,
            max_concurrency: Some(2),
            warm: GenerateRequest {
                prompts: &warm,
                padded_len: 3,
                new_tokens: 4,
                pad_id: 0,
                eos_ids: &[],
            },
            warm_calls: 1,
            pad_multiple: 1,
            pad_cap: 10,
        };
        let load = replay_load(&plan, &prompts, rules);
        let got: Vec<(f64, &[u32], usize)> = load
            .requests
            .iter()
            .map(|r| (r.scheduled_ms, r.prompt, r.output_len))
            .collect();
        assert_eq!(got, [(0., &[5, 6, 7][..], 4), (12.5, &[9, 9, 9][..], 2)]);
        assert_eq!((load.max_batch, load.max_concurrency), (1, Some(2)));
    }
}
