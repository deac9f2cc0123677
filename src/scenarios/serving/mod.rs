//! The serving suite (`--suite serving`, issue #39's first slice): requests arriving over time
//! instead of fixed batches at t = 0, as vLLM's `benchmark_serving` loads a server, but in
//! process (no HTTP): an open loop at `--request-rate` (Poisson, or gamma with
//! `--burstiness`) or a closed loop at `--max-concurrency`, `--num-requests` requests of
//! random token ids (`--input-len`, `--output-len`: fixed or a uniform range), exactly
//! `output_len` new tokens each (EOS banned), all drawn from `--seed` ([`load`]).
//!
//! After untimed warm-up calls, the clock starts at 0 and the requests are served. The candle
//! engine, in process, serves them by continuous batching ([`continuous`], the engine's
//! [`InFlight`] slots: requests join and leave between decode steps, `--batch-size` slots) or,
//! with `--batching static`, through its generation ([`crate::engines::Generate`], the
//! generation suite's path) by static batching ([`queue`]): each free moment of the engine,
//! the arrived requests (up to `--batch-size`) as one call. Every token timed. The HF worker
//! is handed the whole load and replays it on its own clock ([`replay`]): transformers'
//! continuous batching where the model supports it, else (or with `--batching static`) the
//! same static batching. One [`RequestRecord`] per request, then a [`ServingSummary`]
//! ([`crate::metrics::serving`]: TTFT, TPOT, ITL, E2E, throughput, goodput under `--slo`).
//! Over `--tp N` ranks (candle), rank 0 schedules and the other ranks perform each engine
//! operation it broadcasts ([`ranks`]).

pub mod continuous;
pub mod load;
pub mod queue;
pub mod ranks;
pub mod replay;
#[cfg(test)]
mod tp_tests;

use super::generate::special_ids;
use super::skeleton::{base_header, Padding, Scenario};
use super::spec::{RunSpec, ServeOptions};
use crate::data::sha256_hex;
use crate::engines::registry::{self, EngineArgs};
use crate::engines::replay::{Batching, Replay, ReplayLoad, Server};
use crate::engines::{memory_or_warning, EngineKind, Generate, GenerateRequest, InFlight};
use crate::env::EnvReport;
use crate::error::{message_without_backtrace, Error, Result};
use crate::log::RankLog;
use crate::metrics::serving::{summary, ServingEnd};
use crate::models::Architecture;
use crate::record::{DataInfo, Header, Record, RequestRecord, ServingInfo, ServingSummary};
use crate::tokenizer::TextTokenizer;
use crate::trackers::{MemoryReading, StepClock};
use continuous::{serve_continuous, Stepper};
use load::{prompts, schedule, LoadSpec, Planned};
use queue::{serve, Clock, Policy, Served, WallClock};
use ranks::{end, follow, Channel, Op, Role};
use std::time::Instant;

/// How the log header names static batching (`--batching static`, and the HF worker's where
/// the model has no continuous batching); continuous batching is `continuous: ` and the
/// engine's description ([`InFlight::describe`], [`replay::CONTINUOUS`]).
pub const BATCHING_STATIC: &str = "static: the arrived requests, then generate";

/// The header's clock of static batching in this process.
const CLOCK_STATIC: &str = "wall time, ms, from the end of the warm-up; a request's tokens are its batch's steps as the engine timed them (device synchronized), from the call's start";

/// The header's clock of continuous batching over the engine's slots.
const CLOCK_SLOTS: &str = "wall time, ms, from the end of the warm-up; a request's first token is the end of its prefill, each other token the end of the decode step that made it (its ids on the host, the device done)";

/// The serving scenario over its options.
pub struct Serving<'a>(pub &'a ServeOptions);

/// The engine with its requests, ready to serve.
pub struct Started {
    engine: Server,
    /// How it serves (the header's `batching`).
    batching: Batching,
    job: Job,
    /// This rank's part: alone, or rank 0 or another rank of a tensor-parallel group.
    role: Role,
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

impl Job {
    /// The load's schedule and random prompts for `arch` (its pad and EOS ids excluded), and
    /// the warm-up's `batch_size` prompts of the longest input, padded as `padding` says.
    fn new(
        load: &LoadSpec,
        arch: &Architecture,
        batch_size: usize,
        padding: Padding,
    ) -> Result<Self> {
        let plan = schedule(load)?;
        let special = special_ids(arch);
        let mut banned = special.1.clone();
        banned.push(special.0);
        let vocab = vocab_size(arch);
        let lens: Vec<usize> = plan.iter().map(|p| p.input_len).collect();
        let prompts = prompts(&lens, vocab, &banned, load.seed);
        let n_warm = batch_size.min(load.num_requests).max(1);
        // Another seed than the timed prompts': the warm-up does not see them first.
        let warm = load::prompts(
            &vec![load.input_len.max; n_warm],
            vocab,
            &banned,
            !load.seed,
        );
        Ok(Self {
            plan,
            prompts,
            warm,
            special,
            padding,
        })
    }
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
        let tp = spec.tp.as_ref().map(|t| (&t.group, &t.device));
        let role = Role::of(tp, spec.batch_size, load.num_requests)?;
        let mut engine = registry::open_serve(kind, args)?;
        let max_pos = engine.generate().max_positions();
        crate::models::generate::check_lengths(load.input_len.max, load.output_len.max, max_pos)?;
        let padding = Padding {
            multiple: spec.pad_multiple,
            cap: max_pos.saturating_sub(load.output_len.max),
        };
        let job = Job::new(load, &spec.model.arch, spec.batch_size, padding)?;
        let mut mode =
            choose_batching(&mut engine, self.0.batching, spec.batch_size, &job.special)?;
        if let Some(t) = &spec.tp {
            mode.said += &ranks::describe(t.group.size);
        }
        let host = EnvReport::collect();
        let e = engine.generate();
        let header = Header {
            engine: e.name().into(),
            engine_info: e.info(),
            load_seconds: e.load_seconds(),
            serving: Some(Box::new(info(self.0, &mode))),
            // Each call's prompts are left-padded to their longest, rounded up to this.
            pad_multiple: Some(spec.pad_multiple),
            ..base_header(
                spec,
                args.weights,
                &tokenizer,
                host,
                data_info(&job.prompts),
            )
        };
        let started = Started {
            engine,
            batching: mode.batching,
            job,
            role,
        };
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
            Server::Calls(e) => {
                self.serve_calls(spec, e.as_mut(), (s.batching, &s.role), &s.job, log)?
            }
            Server::Replays(e) => match s.role {
                Role::Alone => self.serve_replay(spec, e.as_mut(), &s.job, log)?,
                // The plan refuses it first (the candle engine only).
                _ => return Err(Error::Config(format!(
                    "--tp: the {} engine replays the load in its own process: drop --tp or use --engine candle",
                    e.name()
                ))),
            },
        };
        let memory = match served.failure.is_some() {
            true => MemoryReading::default(),
            false => memory_or_warning(s.engine.generate().finish()),
        };
        let end = ServingEnd {
            n_batches: served.n_batches,
            batch_size_mean: served.batch_size_mean,
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

/// The batching a run serves by: as asked, or as the replaying engine chose.
struct Chosen {
    batching: Batching,
    /// The header's `batching`.
    said: String,
    /// The header's `clock`.
    clock: &'static str,
}

/// How `engine` will batch, asked for `want` (`--batching`): an in-process engine as asked
/// (continuous batching needs its [`InFlight`] slots); an engine that replays the load as it
/// chooses now, before the header names it (static where asked, else continuous where the
/// model has it).
fn choose_batching(
    engine: &mut Server,
    want: Batching,
    max_batch: usize,
    special: &(u32, Vec<u32>),
) -> Result<Chosen> {
    let e = match engine {
        Server::Calls(e) => e,
        Server::Replays(e) => {
            let batching = e.replay_mode(want, max_batch, special.0, &special.1)?.mode;
            let said = replayed_batching(batching).into();
            let clock = replay::CLOCK;
            return Ok(Chosen {
                batching,
                said,
                clock,
            });
        }
    };
    let (said, clock) = match want {
        Batching::Static => (BATCHING_STATIC.to_string(), CLOCK_STATIC),
        Batching::Continuous => match e.in_flight() {
            Some(slots) => (format!("continuous: {}", slots.describe()), CLOCK_SLOTS),
            None => return Err(no_slots(e.name())),
        },
    };
    Ok(Chosen {
        batching: want,
        said,
        clock,
    })
}

/// The header's `batching` for a replay in `mode` (static is the in-process queue's words).
fn replayed_batching(mode: Batching) -> &'static str {
    match mode {
        Batching::Static => BATCHING_STATIC,
        Batching::Continuous => replay::CONTINUOUS,
    }
}

fn no_slots(engine: &str) -> Error {
    Error::Config(format!(
        "--batching continuous: the {engine} engine has no continuous batching: use --batching static"
    ))
}

/// The handler of each group of finished requests' records (the log writes them).
type Write<'a> = dyn FnMut(&[RequestRecord]) -> Result<()> + 'a;

impl Serving<'_> {
    /// Serves the load from this process, on its clock: by the engine's slots or by calls;
    /// over tensor-parallel ranks, as `role` says.
    fn serve_calls(
        &self,
        spec: &RunSpec,
        engine: &mut dyn Generate,
        (batching, role): (Batching, &Role),
        j: &Job,
        log: &mut RankLog,
    ) -> Result<Served> {
        let policy = Policy {
            max_batch: spec.batch_size,
            max_concurrency: self.0.load.max_concurrency,
        };
        let (warmup, load) = (spec.warmup_batches, &self.0.load);
        let mut write = |records: &[RequestRecord]| write_records(log, records);
        match batching {
            Batching::Static => serve_static(engine, j, policy, warmup, load, role, &mut write),
            Batching::Continuous => {
                let name = engine.name().to_string();
                let Some(slots) = engine.in_flight() else {
                    return Err(no_slots(&name));
                };
                serve_slots(slots, j, policy, warmup, load, role, &mut write)
            }
        }
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
        let rules = ReplayLoad {
            requests: vec![],
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
        };
        let load = replay::replay_load(&j.plan, &j.prompts, rules);
        let replayed = match engine.replay(&load) {
            Ok(r) => r,
            // The worker died: nothing it served came back.
            Err(e) => return Ok(Served::failed(e)),
        };
        let records = replay::records(&j.plan, &replayed)?;
        write_records(log, &records)?;
        Ok(Served {
            records,
            n_batches: replayed.n_batches,
            failure: replayed.failure.map(Error::Engine),
            // transformers' manager does not count its decode steps: no mean slots a step.
            batch_size_mean: (replayed.mode == Batching::Continuous).then_some(f64::NAN),
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

/// Static batching ([`queue::serve`]) after the untimed warm-up calls: CUDA loads candle's PTX
/// kernels, cuBLAS creates handles, the memory pools and the KV cache grow; none of that is
/// the engine's serving speed. The warm-up is the same on every rank; then rank 0 of a
/// tensor-parallel group sends each call's requests before it makes the call, and the other
/// ranks make the calls it sends ([`ranks`]).
fn serve_static(
    engine: &mut dyn Generate,
    j: &Job,
    policy: Policy,
    warmup: usize,
    load: &LoadSpec,
    role: &Role,
    write: &mut Write,
) -> Result<Served> {
    let out_max = load.output_len.max;
    let warm_failure = (0..warmup).find_map(|_| {
        let mut clock = StepClock::new(true);
        let req = request((&j.padding, &j.special), &j.warm, out_max);
        engine.generate(&req, &mut clock).err()
    });
    if let Some(e) = warm_failure {
        return Ok(Served::failed(e));
    }
    if let Role::Follower(channel) = role {
        return follow(channel, &mut |op| match op {
            Op::Call(ids) => static_call(engine, j, &ids).map(drop),
            other => Err(unexpected(&other, Batching::Static)),
        });
    }
    let mut clock = WallClock::start();
    let mut failed = false;
    let leader = role.leader();
    let mut call = |ids: &[usize], _: &mut dyn Clock| {
        let sent = leader.map_or(Ok(()), |c| c.send(&Op::Call(ids.to_vec())));
        let laps = sent.and_then(|()| static_call(engine, j, ids));
        failed |= laps.is_err();
        laps
    };
    let served = serve(&j.plan, policy, &mut clock, &mut call, write);
    end(leader, failed, served)
}

/// Static batching's call of requests `ids` (their prompts, the longest output asked): its
/// laps.
fn static_call(engine: &mut dyn Generate, j: &Job, ids: &[usize]) -> Result<Vec<f64>> {
    let prompts: Vec<Vec<u32>> = ids.iter().map(|&i| j.prompts[i].clone()).collect();
    let new = ids.iter().map(|&i| j.plan[i].output_len).max().unwrap_or(1);
    let req = request((&j.padding, &j.special), &prompts, new);
    call_engine(engine, &req)
}

/// Continuous batching ([`continuous::serve_continuous`]) over the engine's slots, after the
/// untimed warm-up rounds: the warm-up prompts join the slots, step to the longest output
/// and leave (the kernels, the handles, the pools, as for static batching). A failure to
/// make the slots (the memory) ends the run as a failed call does. The warm-up is the same
/// on every rank; then rank 0 of a tensor-parallel group sends each join, step and leave
/// before it makes it, and the other ranks make those it sends ([`ranks`]).
fn serve_slots(
    engine: &mut dyn InFlight,
    j: &Job,
    policy: Policy,
    warmup: usize,
    load: &LoadSpec,
    role: &Role,
    write: &mut Write,
) -> Result<Served> {
    let longest = load.input_len.max + load.output_len.max;
    let opened = engine.open_slots(policy.max_batch, longest, j.special.0, &j.special.1);
    let warm = |engine: &mut dyn InFlight| -> Result<()> {
        for (slot, prompt) in j.warm.iter().enumerate().take(policy.max_batch) {
            engine.join(slot, prompt)?;
        }
        for _ in 1..load.output_len.max {
            engine.step()?;
        }
        (0..j.warm.len().min(policy.max_batch)).try_for_each(|slot| engine.leave(slot))
    };
    let ready = opened.and_then(|()| (0..warmup).try_for_each(|_| warm(&mut *engine)));
    if let Err(e) = ready {
        return Ok(Served::failed(e));
    }
    let mut slots = EngineSlots {
        engine,
        prompts: &j.prompts,
        leader: role.leader(),
        failed: false,
    };
    if let Role::Follower(channel) = role {
        return follow(channel, &mut |op| slots.perform(op).map(drop));
    }
    let mut clock = WallClock::start();
    let served = serve_continuous(&j.plan, policy, &mut clock, &mut slots, write);
    end(slots.leader, slots.failed, served)
}

/// The engine's slots as the scheduler drives them: request i's prompt is `prompts[i]`.
struct EngineSlots<'a> {
    engine: &'a mut dyn InFlight,
    prompts: &'a [Vec<u32>],
    /// Rank 0 of a tensor-parallel group: each operation goes to the other ranks first.
    leader: Option<&'a Channel>,
    /// An operation failed on this rank (then no End is sent: [`ranks::end`]).
    failed: bool,
}

impl EngineSlots<'_> {
    /// `op` on the engine, sent to the other ranks first where this rank leads them: the
    /// tokens it made (a join's first token; a step's, one an occupied slot).
    fn perform(&mut self, op: Op) -> Result<usize> {
        let sent = self.leader.map_or(Ok(()), |c| c.send(&op));
        let made = sent.and_then(|()| match op {
            Op::Join { slot, request } => self.engine.join(slot, &self.prompts[request]).map(|_| 1),
            Op::Step => self.engine.step().map(|made| made.len()),
            Op::Leave { slot } => self.engine.leave(slot).map(|()| 0),
            other => Err(unexpected(&other, Batching::Continuous)),
        });
        self.failed |= made.is_err();
        made
    }
}

impl Stepper for EngineSlots<'_> {
    fn join(&mut self, slot: usize, request: usize, _: &mut dyn Clock) -> Result<()> {
        self.perform(Op::Join { slot, request }).map(drop)
    }

    fn step(&mut self, _: &mut dyn Clock) -> Result<usize> {
        self.perform(Op::Step)
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        self.perform(Op::Leave { slot }).map(drop)
    }
}

/// A follower's error for an operation its batching does not make (the ranks disagree).
fn unexpected(op: &Op, batching: Batching) -> Error {
    Error::Engine(format!(
        "--tp serving: rank 0 sent {op:?}, no operation of {batching:?} batching (the ranks disagree)"
    ))
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

/// The log header's description of the load, served as `mode` says.
fn info(opts: &ServeOptions, mode: &Chosen) -> ServingInfo {
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
        batching: mode.said.clone(),
        clock: mode.clock.into(),
        slo_ttft_ms: opts.slo.and_then(|s| s.ttft_ms),
        slo_tpot_ms: opts.slo.and_then(|s| s.tpot_ms),
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
        assert_eq!(replayed_batching(Batching::Static), BATCHING_STATIC);
        assert!(replayed_batching(Batching::Continuous).starts_with("continuous: transformers' "));
    }
}
