//! Serving over tensor-parallel ranks with the real candle engine ([`super::ranks`]): CPU ranks
//! (threads, a TCP all-reduce) serve a load as `bench --tp 2` does, and every rank's engine
//! makes the one process's tokens, in the same order. The serving log records times, not ids:
//! this is where the suite's numerics over ranks are checked (issue #39 item 5).

use super::load::{LenRange, LoadSpec};
use super::queue::Policy;
use super::ranks::Role;
use super::{serve_slots, serve_static, Job};
use crate::device::Precision;
use crate::dist::test_ranks::on_ranks;
use crate::engines::candle::{CandleEngine, LoadFrom};
use crate::engines::{Engine, Generate, GenerateRequest, InFlight};
use crate::error::Result;
use crate::models::{ModelSpec, WeightSource};
use crate::record::RequestRecord;
use crate::scenarios::skeleton::Padding;
use crate::trackers::{MemoryReading, StepClock};
use candle_core::Device;
use std::collections::BTreeMap;

/// The candle engine, with every token it hands back recorded in order (a call's rows, a
/// join's first token, a step's (slot, token) pairs).
struct Recorded {
    inner: CandleEngine,
    made: Vec<Vec<u32>>,
}

impl Engine for Recorded {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn info(&self) -> BTreeMap<String, String> {
        self.inner.info()
    }
    fn load_seconds(&self) -> f64 {
        self.inner.load_seconds()
    }
    fn finish(&mut self) -> Result<MemoryReading> {
        self.inner.finish()
    }
}

impl Generate for Recorded {
    fn max_positions(&self) -> usize {
        Generate::max_positions(&self.inner)
    }
    fn generate(&mut self, req: &GenerateRequest, clock: &mut StepClock) -> Result<Vec<Vec<u32>>> {
        let ids = self.inner.generate(req, clock)?;
        self.made.extend(ids.iter().cloned());
        Ok(ids)
    }
    fn in_flight(&mut self) -> Option<&mut dyn InFlight> {
        Some(self)
    }
}

impl InFlight for Recorded {
    fn open_slots(&mut self, slots: usize, longest: usize, pad: u32, eos: &[u32]) -> Result<()> {
        self.inner.open_slots(slots, longest, pad, eos)
    }
    fn join(&mut self, slot: usize, prompt: &[u32]) -> Result<u32> {
        let first = self.inner.join(slot, prompt)?;
        self.made.push(vec![first]);
        Ok(first)
    }
    fn step(&mut self) -> Result<Vec<(usize, u32)>> {
        let made = self.inner.step()?;
        self.made
            .push(made.iter().flat_map(|&(s, t)| [s as u32, t]).collect());
        Ok(made)
    }
    fn leave(&mut self, slot: usize) -> Result<()> {
        self.inner.leave(slot)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// 7 requests arriving at once (so the schedule does not depend on the clock), prompts of 2 to
/// 9 tokens, outputs of 1 to 5, at most 3 together.
fn load() -> LoadSpec {
    LoadSpec {
        num_requests: 7,
        request_rate: f64::INFINITY,
        burstiness: 1.,
        max_concurrency: None,
        input_len: LenRange { min: 2, max: 9 },
        output_len: LenRange { min: 1, max: 5 },
        seed: 5,
    }
}

/// Each rank's (requests it served, tokens its engine made) serving [`load`] on `size` ranks,
/// by continuous batching or, `static_`, by calls.
fn served(size: usize, model: &'static str, static_: bool) -> Vec<(usize, Vec<Vec<u32>>)> {
    on_ranks(size, move |tp| {
        let spec = ModelSpec::preset(model).unwrap();
        let from = LoadFrom {
            weights: &WeightSource::Random { seed: 3 },
            tp: (tp.size > 1).then_some(&tp),
            save: None,
            progress: false,
        };
        let inner = CandleEngine::load(&spec, from, Precision::Fp32, Device::Cpu).unwrap();
        let mut engine = Recorded {
            inner,
            made: vec![],
        };
        let (load, max_batch) = (load(), 3);
        let cap = Generate::max_positions(&engine) - load.output_len.max;
        let padding = Padding { multiple: 1, cap };
        let job = Job::new(&load, &spec.arch, max_batch, padding).unwrap();
        let role = Role::of(Some((&tp, &Device::Cpu)), max_batch, load.num_requests).unwrap();
        let policy = Policy {
            max_batch,
            max_concurrency: None,
        };
        let mut write = |_: &[RequestRecord]| Ok(());
        let served = match static_ {
            true => serve_static(&mut engine, &job, policy, 1, &load, &role, &mut write),
            false => serve_slots(&mut engine, &job, policy, 1, &load, &role, &mut write),
        }
        .unwrap();
        assert!(served.failure.is_none(), "{:?}", served.failure);
        (served.records.len(), engine.made)
    })
}

/// Rank 0 serves every request and rank 1 none of its own, and both engines make the tokens
/// of one process, call by call and step by step (fp32 greedy ids, gpt2-tiny and
/// bloom-tiny, continuous and static batching).
#[test]
fn tp_ranks_make_the_one_process_tokens() {
    for model in ["gpt2-tiny", "bloom-tiny"] {
        for static_ in [false, true] {
            let (n, one) = served(1, model, static_).remove(0);
            assert_eq!(n, 7);
            let ranks = served(2, model, static_);
            let served: Vec<usize> = ranks.iter().map(|r| r.0).collect();
            assert_eq!(served, [7, 0], "{model}: rank 0 serves and logs");
            for (rank, (_, made)) in ranks.iter().enumerate() {
                assert_eq!(made, &one, "{model} static {static_}: rank {rank}");
            }
            // The warm-up, then at least one token a request.
            assert!(one.len() > 7, "{model}: {one:?}");
        }
    }
}
