//! The serving suite (`--suite serving`, issue #39's first slice): requests arriving over time
//! instead of fixed batches at t = 0, as vLLM's `benchmark_serving` loads a server, but in
//! process (no HTTP): an open loop at `--request-rate` (Poisson, or gamma with
//! `--burstiness`) or a closed loop at `--max-concurrency`, `--num-requests` requests of
//! random token ids (`--input-len`, `--output-len`: fixed or a uniform range), exactly
//! `output_len` new tokens each (EOS banned), all drawn from `--seed` ([`load`]).
//!
//! After untimed warm-up calls, the clock starts at 0 and the requests are served. The candle
//! engine, in process, serves them call by call through its generation
//! ([`crate::engines::Generate`], the generation suite's path) and static batching ([`queue`]):
//! each free moment of the engine, the arrived requests (up to `--batch-size`) as one call,
//! every token timed. The HF worker is handed the whole load and replays it on its own clock
//! ([`replay`]): transformers' continuous batching where the model supports it, else the same
//! static batching. One [`RequestRecord`] per request, then a [`ServingSummary`]
//! ([`crate::metrics::serving`]: TTFT, TPOT, ITL, E2E, throughput, goodput under `--slo`).

pub mod load;
pub mod queue;
pub mod replay;

use super::generate::special_ids;
use super::skeleton::{base_header, Padding, Scenario};
use super::spec::{RunSpec, ServeOptions};
use crate::data::sha256_hex;
use crate::engines::registry::{self, EngineArgs};
use crate::engines::replay::{Replay, ReplayMode, Server};
use crate::engines::{memory_or_warning, EngineKind, Generate, GenerateRequest};
use crate::env::EnvReport;
use crate::error::{message_without_backtrace, Error, Result};
use crate::log::RankLog;
use crate::metrics::serving::{summary, ServingEnd};
use crate::models::Architecture;
use crate::record::{DataInfo, Header, Record, RequestRecord, ServingInfo, ServingSummary};
use crate::tokenizer::TextTokenizer;
use crate::trackers::{MemoryReading, StepClock};
use load::{prompts, schedule, Planned};
use queue::{serve, Clock, Policy, Served, WallClock};
use std::time::Instant;

/// How the log header names static batching (the in-process queue's, and the HF worker's
/// where the model has no continuous batching).
pub const BATCHING: &str = "static: the arrived requests, then generate";

/// The serving scenario over its options.
pub struct Serving<'a>(pub &'a ServeOptions);

/// The engine with its requests, ready to serve.
pub struct Started {
    engine: Server,
    job: Job,
}

/// The requests and how each call is made.
struct Job {
    plan: Vec<Planned>,
    /// Request i's prompt (random ids, `plan[i].input_len` of them).
    prompts: Vec<Vec<u32>>,
    /// The warm-up call's prompts: the longest input, the run's batch size.
    warm: Vec<Vec<u32>>,
    /// (pad id, EOS ids never generated).
    special: (u32, Vec<u32>),
    padding: Padding,
}

impl Scenario for Serving<'_> {
    type Summary = ServingSummary;
    type Started = Started;

    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<(Started, Header)> {
        let load = &self.0.load;
        let tokenizer =
            TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;
        let mut engine = registry::open_serve(kind, args)?;
        let special = special_ids(&spec.model.arch);
        // An engine that replays the load chooses its batching now: the header names it.
        let mode = match &mut engine {
            Server::Calls(_) => None,
            Server::Replays(e) => Some(e.replay_mode(spec.batch_size, special.0, &special.1)?.mode),
        };
        let max_pos = engine.generate().max_positions();
        crate::models::generate::check_lengths(load.input_len.max, load.output_len.max, max_pos)?;
        let plan = schedule(load)?;
        let mut banned = special.1.clone();
        banned.push(special.0);
        let vocab = vocab_size(&spec.model.arch);
        let lens: Vec<usize> = plan.iter().map(|p| p.input_len).collect();
        let prompts = prompts(&lens, vocab, &banned, load.seed);
        let n_warm = spec.batch_size.min(load.num_requests).max(1);
        // Another seed than the timed prompts': the warm-up does not see them first.
        let warm = load::prompts(
            &vec![load.input_len.max; n_warm],
            vocab,
            &banned,
            !load.seed,
        );
        let host = EnvReport::collect();
        let e = engine.generate();
        let header = Header {
            engine: e.name().into(),
            engine_info: e.info(),
            load_seconds: e.load_seconds(),
            serving: Some(Box::new(info(self.0, mode.as_ref()))),
            // Each call's prompts are left-padded to their longest, rounded up to this.
            pad_multiple: Some(spec.pad_multiple),
            ..base_header(spec, args.weights, &tokenizer, host, data_info(&prompts))
        };
        let padding = Padding {
            multiple: spec.pad_multiple,
            cap: max_pos.saturating_sub(load.output_len.max),
        };
        let job = Job {
            plan,
            prompts,
            warm,
            special,
            padding,
        };
        let started = Started { engine, job };
        Ok((started, header))
    }

    fn run(
        &self,
        spec: &RunSpec,
        mut s: Started,
        _header: &Header,
        log: &mut RankLog,
        wall: Instant,
    ) -> Result<(ServingSummary, Option<Error>)> {
        let served = match &mut s.engine {
            Server::Calls(e) => self.serve_calls(spec, e.as_mut(), &s.job, log)?,
            Server::Replays(e) => self.serve_replay(spec, e.as_mut(), &s.job, log)?,
        };
        let memory = match served.failure.is_some() {
            true => MemoryReading::default(),
            false => memory_or_warning(s.engine.generate().finish()),
        };
        let end = ServingEnd {
            n_batches: served.n_batches,
            failure: served
                .failure
                .as_ref()
                .map(|e| message_without_backtrace(&e.to_string())),
            wall_seconds: wall.elapsed().as_secs_f64(),
            memory,
        };
        let summary = summary(&served.records, self.0.slo.as_ref(), end);
        Ok((summary, served.failure))
    }

    fn record(summary: Box<ServingSummary>) -> Record {
        Record::ServingSummary(summary)
    }
}

impl Serving<'_> {
    /// Serves the load call by call on this process's clock ([`queue`]), after untimed
    /// warm-up calls.
    fn serve_calls(
        &self,
        spec: &RunSpec,
        engine: &mut dyn Generate,
        j: &Job,
        log: &mut RankLog,
    ) -> Result<Served> {
        let out_max = self.0.load.output_len.max;
        // Untimed warm-up calls: CUDA loads candle's PTX kernels, cuBLAS creates handles, the
        // memory pools and the KV cache grow; none of that is the engine's serving speed.
        let failure = (0..spec.warmup_batches).find_map(|_| {
            let mut clock = StepClock::new(true);
            let req = request((&j.padding, &j.special), &j.warm, out_max);
            engine.generate(&req, &mut clock).err()
        });
        if let Some(e) = failure {
            return Ok(Served {
                records: vec![],
                n_batches: 0,
                failure: Some(e),
            });
        }
        let policy = Policy {
            max_batch: spec.batch_size,
            max_concurrency: self.0.load.max_concurrency,
        };
        let mut clock = WallClock::start();
        let plan = &j.plan;
        let mut call = |ids: &[usize], _: &mut dyn Clock| {
            let prompts: Vec<Vec<u32>> = ids.iter().map(|&i| j.prompts[i].clone()).collect();
            let new = ids.iter().map(|&i| plan[i].output_len).max().unwrap_or(1);
            let req = request((&j.padding, &j.special), &prompts, new);
            call_engine(engine, &req)
        };
        let mut write = |records: &[RequestRecord]| write_records(log, records);
        serve(plan, policy, &mut clock, &mut call, &mut write)
    }

    /// Hands the engine the whole load, which it replays on its own clock after its untimed
    /// warm-up ([`replay`]); its requests' records are written as the replay returns.
    fn serve_replay(
        &self,
        spec: &RunSpec,
        engine: &mut dyn Replay,
        j: &Job,
        log: &mut RankLog,
    ) -> Result<Served> {
        let load = replay::replay_load(replay::LoadParts {
            plan: &j.plan,
            prompts: &j.prompts,
            max_batch: spec.batch_size,
            max_concurrency: self.0.load.max_concurrency,
            warm: request(
                (&j.padding, &j.special),
                &j.warm,
                self.0.load.output_len.max,
            ),
            warm_calls: spec.warmup_batches,
            pad_multiple: j.padding.multiple,
            pad_cap: j.padding.cap,
        });
        let replayed = match engine.replay(&load) {
            Ok(r) => r,
            // The worker died: nothing it served came back.
            Err(e) => {
                return Ok(Served {
                    records: vec![],
                    n_batches: 0,
                    failure: Some(e),
                })
            }
        };
        let records = replay::records(&j.plan, &replayed)?;
        write_records(log, &records)?;
        Ok(Served {
            records,
            n_batches: replayed.n_batches,
            failure: replayed.failure.map(Error::Engine),
        })
    }
}

/// Each record to the log, as it exists.
fn write_records(log: &mut RankLog, records: &[RequestRecord]) -> Result<()> {
    for r in records {
        log.write(&Record::Request(Box::new(r.clone())))?;
    }
    Ok(())
}

/// One engine call, every token timed; its laps (ms after the call's start), checked: a row
/// per prompt, `new_tokens` ids and laps.
fn call_engine(engine: &mut dyn Generate, req: &GenerateRequest) -> Result<Vec<f64>> {
    let mut clock = StepClock::new(true);
    let ids = engine.generate(req, &mut clock)?;
    let laps = clock.laps_ms().to_vec();
    if ids.len() != req.prompts.len() || ids.iter().any(|r| r.len() != req.new_tokens) {
        return Err(Error::Engine(format!(
            "{} returned {} rows for {} prompts of {} new tokens",
            engine.name(),
            ids.len(),
            req.prompts.len(),
            req.new_tokens
        )));
    }
    Ok(laps)
}

/// A call of `prompts`, left-padded as `padding` says, `new_tokens` each.
fn request<'a>(
    (padding, special): (&Padding, &'a (u32, Vec<u32>)),
    prompts: &'a [Vec<u32>],
    new_tokens: usize,
) -> GenerateRequest<'a> {
    GenerateRequest {
        padded_len: padding.len(prompts.iter().map(Vec::len).max().unwrap_or(0)),
        prompts,
        new_tokens,
        pad_id: special.0,
        eos_ids: &special.1,
    }
}

/// The log header's description of the load; `replayed`: the engine replays it itself, in
/// this mode.
fn info(opts: &ServeOptions, replayed: Option<&ReplayMode>) -> ServingInfo {
    let l = &opts.load;
    ServingInfo {
        num_requests: l.num_requests,
        request_rate: l.request_rate.is_finite().then_some(l.request_rate),
        burstiness: l.burstiness,
        max_concurrency: l.max_concurrency,
        input_len: (l.input_len.min, l.input_len.max),
        output_len: (l.output_len.min, l.output_len.max),
        seed: l.seed,
        prompts: "random token ids (pad and EOS excluded); exactly output_len new tokens, greedy, EOS banned".into(),
        batching: replayed.map_or(BATCHING, batching).into(),
        clock: match replayed {
            None => "wall time, ms, from the end of the warm-up; a request's tokens are its batch's steps as the engine timed them (device synchronized), from the call's start",
            Some(_) => replay::CLOCK,
        }
        .into(),
        slo_ttft_ms: opts.slo.and_then(|s| s.ttft_ms),
        slo_tpot_ms: opts.slo.and_then(|s| s.tpot_ms),
    }
}

/// The header's `batching` for a replay in `mode` (static is the in-process queue's words).
fn batching(mode: &ReplayMode) -> &'static str {
    match mode {
        ReplayMode::Static => BATCHING,
        ReplayMode::Continuous => replay::CONTINUOUS,
    }
}

/// The prompts as the log's data: their ids' checksum (the seed makes them).
fn data_info(prompts: &[Vec<u32>]) -> DataInfo {
    let bytes: Vec<u8> = prompts
        .iter()
        .flatten()
        .flat_map(|id| id.to_le_bytes())
        .collect();
    DataInfo {
        path: "random token ids (--seed)".into(),
        sha256: sha256_hex(&bytes),
        n_samples: prompts.len(),
        matches_reference: None,
    }
}

fn vocab_size(arch: &Architecture) -> usize {
    match arch {
        Architecture::Gpt2(c) => c.vocab_size,
        Architecture::Bloom(c) => c.vocab_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker's static fallback is named as the in-process queue's batching, so that
    /// extract-metrics' `batching` column groups the two.
    #[test]
    fn a_replay_s_mode_names_its_batching() {
        assert_eq!(batching(&ReplayMode::Static), BATCHING);
        assert!(batching(&ReplayMode::Continuous).starts_with("continuous: transformers' "));
    }
}
