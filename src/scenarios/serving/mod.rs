//! The serving suite (`--suite serving`, issue #39's first slice): requests arriving over time
//! instead of fixed batches at t = 0, as vLLM's `benchmark_serving` loads a server, but in
//! process (no HTTP): an open loop at `--request-rate` (Poisson, or gamma with
//! `--burstiness`) or a closed loop at `--max-concurrency`, `--num-requests` requests of
//! random token ids (`--input-len`, `--output-len`: fixed or a uniform range), exactly
//! `output_len` new tokens each (EOS banned), all drawn from `--seed` ([`load`]).
//!
//! After untimed warm-up calls, the clock starts at 0 and the requests are served by
//! continuous batching ([`continuous`], the engine's [`InFlight`] slots: requests join and
//! leave between decode steps, `--batch-size` slots) or, with `--batching static`, by the
//! engine's generation ([`crate::engines::Generate`], the generation suite's path) through
//! static batching ([`queue`]): each free moment of the engine, the arrived requests (up to
//! `--batch-size`) as one call. Every token timed. One [`RequestRecord`] per request, then a
//! [`ServingSummary`] ([`crate::metrics::serving`]: TTFT, TPOT, ITL, E2E, throughput, goodput
//! under `--slo`). The candle engine only: the HF worker has no serving path yet.

pub mod continuous;
pub mod load;
pub mod queue;

use super::generate::special_ids;
use super::skeleton::{base_header, Padding, Scenario};
use super::spec::{RunSpec, ServeOptions};
use crate::data::sha256_hex;
use crate::engines::registry::{self, EngineArgs};
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
use queue::{serve, Batching, Clock, Policy, Served, WallClock};
use std::time::Instant;

/// How the log header names static batching (`--batching static`); continuous batching is
/// `continuous: ` and the engine's description ([`InFlight::describe`]).
pub const BATCHING_STATIC: &str = "static: the arrived requests, then generate";

/// The serving scenario over its options.
pub struct Serving<'a>(pub &'a ServeOptions);

/// The engine with its requests, ready to serve.
pub struct Started {
    engine: Box<dyn Generate>,
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
        let mut engine = registry::open_generate(kind, args)?;
        let batching = match self.0.batching {
            Batching::Static => BATCHING_STATIC.to_string(),
            Batching::Continuous => match engine.in_flight() {
                Some(e) => format!("continuous: {}", e.describe()),
                None => {
                    return Err(Error::Config(format!(
                        "--batching continuous: the {} engine has no continuous batching: use --batching static",
                        engine.name()
                    )))
                }
            },
        };
        let max_pos = engine.max_positions();
        crate::models::generate::check_lengths(load.input_len.max, load.output_len.max, max_pos)?;
        let plan = schedule(load)?;
        let special = special_ids(&spec.model.arch);
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
        let header = Header {
            engine: engine.name().into(),
            engine_info: engine.info(),
            load_seconds: engine.load_seconds(),
            serving: Some(Box::new(info(self.0, batching))),
            // Each call's prompts are left-padded to their longest, rounded up to this.
            pad_multiple: Some(spec.pad_multiple),
            ..base_header(spec, args.weights, &tokenizer, host, data_info(&prompts))
        };
        let padding = Padding {
            multiple: spec.pad_multiple,
            cap: max_pos.saturating_sub(load.output_len.max),
        };
        let started = Started {
            engine,
            plan,
            prompts,
            warm,
            special,
            padding,
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
        let policy = Policy {
            max_batch: spec.batch_size,
            max_concurrency: self.0.load.max_concurrency,
        };
        let mut write = |records: &[RequestRecord]| -> Result<()> {
            for r in records {
                log.write(&Record::Request(Box::new(r.clone())))?;
            }
            Ok(())
        };
        let warmup = spec.warmup_batches;
        let done = match self.0.batching {
            Batching::Static => serve_static(&mut s, policy, warmup, &self.0.load, &mut write)?,
            Batching::Continuous => serve_slots(&mut s, policy, warmup, &self.0.load, &mut write)?,
        };
        let (failure, records, n_batches) = (done.failure, done.records, done.n_batches);
        let memory = match failure.is_some() {
            true => MemoryReading::default(),
            false => memory_or_warning(s.engine.finish()),
        };
        let end = ServingEnd {
            n_batches,
            batch_size_mean: done.batch_size_mean,
            failure: failure
                .as_ref()
                .map(|e| message_without_backtrace(&e.to_string())),
            wall_seconds: wall.elapsed().as_secs_f64(),
            memory,
        };
        Ok((summary(&records, self.0.slo.as_ref(), end), failure))
    }

    fn record(summary: Box<ServingSummary>) -> Record {
        Record::ServingSummary(summary)
    }
}

/// The handler of each group of finished requests' records (the log writes them).
type Write<'a> = dyn FnMut(&[RequestRecord]) -> Result<()> + 'a;

/// Static batching ([`queue::serve`]) after the untimed warm-up calls: CUDA loads candle's PTX
/// kernels, cuBLAS creates handles, the memory pools and the KV cache grow; none of that is
/// the engine's serving speed.
fn serve_static(
    s: &mut Started,
    policy: Policy,
    warmup: usize,
    load: &LoadSpec,
    write: &mut Write,
) -> Result<Served> {
    let out_max = load.output_len.max;
    let warm_failure = (0..warmup).find_map(|_| {
        let mut clock = StepClock::new(true);
        let req = request((&s.padding, &s.special), &s.warm, out_max);
        s.engine.generate(&req, &mut clock).err()
    });
    if let Some(e) = warm_failure {
        return Ok(Served::failed(e));
    }
    let mut clock = WallClock::start();
    let (engine, plan) = (&mut s.engine, &s.plan);
    let mut call = |ids: &[usize], _: &mut dyn Clock| {
        let prompts: Vec<Vec<u32>> = ids.iter().map(|&i| s.prompts[i].clone()).collect();
        let new = ids.iter().map(|&i| plan[i].output_len).max().unwrap_or(1);
        let req = request((&s.padding, &s.special), &prompts, new);
        call_engine(engine.as_mut(), &req)
    };
    serve(&s.plan, policy, &mut clock, &mut call, write)
}

/// Continuous batching ([`continuous::serve_continuous`]) over the engine's slots, after the
/// untimed warm-up rounds: the warm-up prompts join the slots, step to the longest output
/// and leave (the kernels, the handles, the pools, as for static batching). A failure to
/// make the slots (the memory) ends the run as a failed call does.
fn serve_slots(
    s: &mut Started,
    policy: Policy,
    warmup: usize,
    load: &LoadSpec,
    write: &mut Write,
) -> Result<Served> {
    let Some(engine) = s.engine.in_flight() else {
        return Err(Error::Config(
            "--batching continuous: the engine has no continuous batching: use --batching static"
                .into(),
        ));
    };
    let longest = load.input_len.max + load.output_len.max;
    let opened = engine.open_slots(policy.max_batch, longest, s.special.0, &s.special.1);
    let warm = |engine: &mut dyn InFlight| -> Result<()> {
        for (slot, prompt) in s.warm.iter().enumerate().take(policy.max_batch) {
            engine.join(slot, prompt)?;
        }
        for _ in 1..load.output_len.max {
            engine.step()?;
        }
        (0..s.warm.len().min(policy.max_batch)).try_for_each(|slot| engine.leave(slot))
    };
    let ready = opened.and_then(|()| (0..warmup).try_for_each(|_| warm(&mut *engine)));
    if let Err(e) = ready {
        return Ok(Served::failed(e));
    }
    let mut clock = WallClock::start();
    let mut slots = EngineSlots {
        engine,
        prompts: &s.prompts,
    };
    serve_continuous(&s.plan, policy, &mut clock, &mut slots, write)
}

/// The engine's slots as the scheduler drives them: request i's prompt is `prompts[i]`.
struct EngineSlots<'a> {
    engine: &'a mut dyn InFlight,
    prompts: &'a [Vec<u32>],
}

impl Stepper for EngineSlots<'_> {
    fn join(&mut self, slot: usize, request: usize, _: &mut dyn Clock) -> Result<()> {
        self.engine.join(slot, &self.prompts[request]).map(drop)
    }

    fn step(&mut self, _: &mut dyn Clock) -> Result<usize> {
        Ok(self.engine.step()?.len())
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        self.engine.leave(slot)
    }
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

/// The log header's description of the load.
fn info(opts: &ServeOptions, batching: String) -> ServingInfo {
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
        clock: match opts.batching {
            Batching::Static => "wall time, ms, from the end of the warm-up; a request's tokens are its batch's steps as the engine timed them (device synchronized), from the call's start",
            Batching::Continuous => "wall time, ms, from the end of the warm-up; a request's first token is the end of its prefill, each other token the end of the decode step that made it (its ids on the host, the device done)",
        }.into(),
        batching,
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
