//! Continuous (in-flight) batching's KV cache: `B` slots, rows of one [`KvCache`], that
//! requests join and leave between decode steps, as vLLM's scheduler runs a batch whose
//! members change at every iteration (Yu et al., "Orca", OSDI 2022: iteration-level
//! scheduling).
//!
//! - **Join**: a request's prompt is prefilled alone, into a one-row cache of its own (the
//!   same forward as [`super::generate::generate`] of that prompt, so its first token is the
//!   offline one), and its keys and values are copied into a free row, ending at the shared
//!   column where the next decode step writes ([`KvCache::place_row`]); the row's earlier
//!   columns are padding (mask 0).
//! - **Decode step**: one forward of one token over all B rows at one column, as the static
//!   path's steps; each row's position is its own (`seen`: GPT-2's position id; BLOOM's ALiBi
//!   reads the keys' positions), and each row attends only its own real keys (the per-row key
//!   mask, which the decode kernel already reads for left padding). A free row runs a pad
//!   token under mask 0; its output is dropped.
//! - **Leave**: the row is free at once; the next join overwrites it whole.
//!
//! Columns only grow, so they are compacted ([`KvCache::drop_front`]) when the padding
//! every row has at the front is half the columns or more, or the next step would not fit.
//! A request holds at most `longest` positions (prompt + output − 1 cached), so with 2 ·
//! `longest` columns the front half is padding for every row whenever the cache is full:
//! compaction always frees room.
//!
//! Not a CUDA graph: a join or a compaction moves what a replay would read (see
//! [`KvCache::start_device_cursor`]), so the steps run eagerly, each one's ids read back
//! to the host.
//!
//! Shapes: `B` slots, `P` prompt tokens, `V` vocab.

use super::generate::Picker;
use super::{CausalLm, KvCache};
use crate::error::{Error, Result};
use candle_core::Tensor;

/// A request in a slot.
#[derive(Clone, Copy, Debug)]
struct Row {
    /// Column of its first token.
    first: usize,
    /// Its tokens in the cache (prompt, then every token fed back).
    seen: usize,
    /// Its newest token: the next step's input.
    last: u32,
}

/// `B` slots over one KV cache of 2 · `longest` columns, and the one-row cache prompts are
/// prefilled in.
pub struct Slots {
    cache: KvCache,
    prefill: KvCache,
    rows: Vec<Option<Row>>,
    /// Positions a request may hold: its prompt + output tokens.
    longest: usize,
    pad_id: u32,
    banned: Vec<u32>,
    picker: Option<Picker>,
}

impl Slots {
    /// `slots` rows for requests of at most `longest` positions (prompt + output tokens) of
    /// `model`; `pad_id` feeds the free rows, `banned` ids are never chosen (EOS: exactly
    /// `output_len` tokens, as HF's `min_new_tokens`).
    pub fn new(
        model: &dyn CausalLm,
        slots: usize,
        longest: usize,
        pad_id: u32,
        banned: Vec<u32>,
    ) -> Result<Self> {
        if longest < 2 || longest > model.max_positions() {
            return Err(Error::Config(format!(
                "slots for requests of {longest} positions: the model takes 2 to {}",
                model.max_positions()
            )));
        }
        Ok(Self {
            cache: model.new_cache(slots, 2 * longest)?,
            prefill: model.new_cache(1, longest)?,
            rows: vec![None; slots],
            longest,
            pad_id,
            banned,
            picker: None,
        })
    }

    /// Slots in all (B).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Slots holding a request.
    pub fn occupied(&self) -> usize {
        self.rows.iter().flatten().count()
    }

    /// Bytes of the keys and values (both caches).
    pub fn bytes(&self) -> usize {
        self.cache.bytes() + self.prefill.bytes()
    }

    /// Columns written (what a decode step attends).
    pub fn columns(&self) -> usize {
        self.cache.len()
    }

    /// Prefills `prompt` alone and places it in the free slot `slot`: returns its first
    /// token (on the host; the device is done with the prefill).
    pub fn join(&mut self, model: &dyn CausalLm, slot: usize, prompt: &[u32]) -> Result<u32> {
        let p = prompt.len();
        match self.rows.get(slot) {
            Some(None) => {}
            Some(Some(_)) => return Err(Error::Engine(format!("slot {slot} is taken"))),
            None => return Err(Error::Engine(format!("no slot {slot} of {}", self.len()))),
        }
        if p == 0 || p >= self.longest {
            return Err(Error::Config(format!(
                "a prompt of {p} tokens does not fit slots of {} positions (prompt + output): at least 1 token, and room for 1 new",
                self.longest
            )));
        }
        let device = self.cache.device().clone();
        self.prefill.reset()?;
        let ids = Tensor::from_slice(prompt, (1, p), &device)?; // (1, P)
        let mask = Tensor::ones((1, p), candle_core::DType::U32, &device)?; // (1, P)
        let logits = match model.prefill_packed(&ids, &[p], &mut self.prefill)? {
            Some(logits) => logits, // (1, V)
            None => model.forward_cached(&ids, &mask, &mut self.prefill)?,
        };
        if self.picker.is_none() {
            self.picker = Some(Picker::new(&self.banned, &logits)?);
        }
        let picker = self.picker.as_ref().expect("made above");
        let first = picker.pick(&logits)?.flatten_all()?.to_vec1::<u32>()?[0];
        if self.occupied() == 0 {
            self.cache.reset()?; // every column padding: start again at column 0
        }
        // The prompt ends where the next step writes; a prompt longer than the columns so far
        // pads every row up to its length.
        self.cache.pad_to(p)?;
        let at = self.cache.len() - p;
        self.cache.place_row(slot, &self.prefill, at)?;
        self.rows[slot] = Some(Row {
            first: at,
            seen: p,
            last: first,
        });
        Ok(first)
    }

    /// One decode step of every occupied slot: each one's next token, (slot, id), on the host.
    pub fn step(&mut self, model: &dyn CausalLm) -> Result<Vec<(usize, u32)>> {
        let live: Vec<(usize, Row)> = (self.rows.iter().enumerate())
            .filter_map(|(i, r)| r.map(|r| (i, r)))
            .collect();
        let Some(front) = live.iter().map(|(_, r)| r.first).min() else {
            return Err(Error::Engine(
                "a decode step with no request in a slot".into(),
            ));
        };
        if let Some((slot, _)) = live.iter().find(|(_, r)| r.seen >= self.longest) {
            return Err(Error::Engine(format!(
                "slot {slot} holds {} positions already, its limit: it should have left",
                self.longest
            )));
        }
        let len = self.cache.len();
        if front > 0 && (2 * front >= len || len + 1 > self.cache.max_len()) {
            self.cache.drop_front(front)?;
            for r in self.rows.iter_mut().flatten() {
                r.first -= front;
            }
        }
        let (ids, mask): (Vec<u32>, Vec<u32>) = (self.rows.iter())
            .map(|r| r.map_or((self.pad_id, 0), |r| (r.last, 1)))
            .unzip();
        let device = self.cache.device().clone();
        let b = self.rows.len();
        let ids = Tensor::from_vec(ids, (b, 1), &device)?; // (B, 1)
        let mask = Tensor::from_vec(mask, (b, 1), &device)?; // (B, 1)
        let seen_max = live.iter().map(|(_, r)| r.seen).max().unwrap_or(0);
        self.cache.bound_positions(seen_max);
        let logits = model.forward_cached(&ids, &mask, &mut self.cache)?; // (B, V)
        let picker = self.picker.as_ref().ok_or_else(|| {
            Error::Engine("a decode step before any prefill".into()) // join made it
        })?;
        let next = picker.pick(&logits)?.flatten_all()?.to_vec1::<u32>()?; // (B,)
        let mut out = Vec::with_capacity(live.len());
        for (slot, r) in self.rows.iter_mut().enumerate() {
            if let Some(r) = r {
                r.seen += 1;
                r.last = next[slot];
                out.push((slot, r.last));
            }
        }
        Ok(out)
    }

    /// Frees `slot` (its request has its tokens).
    pub fn leave(&mut self, slot: usize) -> Result<()> {
        match self.rows.get_mut(slot) {
            Some(r @ Some(_)) => {
                *r = None;
                Ok(())
            }
            _ => Err(Error::Engine(format!("slot {slot} holds no request"))),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::models::generate::{generate, left_pad, Greedy};
    use crate::models::{ModelSpec, WeightSource};
    use candle_core::{DType, Device};

    /// A request of the test load: joins at or after decode step `at`, `prompt`, `out` tokens.
    pub(crate) struct Req {
        at: usize,
        prompt: Vec<u32>,
        out: usize,
    }

    pub(crate) fn req(at: usize, prompt_len: usize, out: usize, seed: u32) -> Req {
        let prompt = (0..prompt_len as u32).map(|i| 5 + (i * 7 + seed * 13) % 90);
        Req {
            at,
            prompt: prompt.collect(),
            out,
        }
    }

    /// Serves `reqs` through `slots` rows: before each decode step, every request due (its
    /// `at` reached) joins a free slot, first due first; a request leaves as soon as it has
    /// its tokens. Returns each request's tokens and the slot it took, the columns before and
    /// after every step, and whether a prompt joined a running batch of fewer columns.
    fn serve(model: &dyn CausalLm, n_slots: usize, reqs: &[Req], banned: &[u32]) -> Served {
        let longest = reqs.iter().map(|r| r.prompt.len() + r.out).max().unwrap();
        let mut slots = Slots::new(model, n_slots, longest, 0, banned.to_vec()).unwrap();
        let mut tokens = vec![vec![]; reqs.len()];
        let mut slot_of = vec![usize::MAX; reqs.len()];
        let mut in_slot: Vec<Option<usize>> = vec![None; n_slots];
        let (mut next, mut step, mut columns, mut padded) = (0, 0, vec![], false);
        while tokens.iter().zip(reqs).any(|(t, r)| t.len() < r.out) {
            while next < reqs.len() && reqs[next].at <= step {
                let Some(slot) = in_slot.iter().position(Option::is_none) else {
                    break;
                };
                let p = reqs[next].prompt.len();
                padded |= slots.occupied() > 0 && slots.columns() < p;
                let first = slots.join(model, slot, &reqs[next].prompt).unwrap();
                tokens[next].push(first);
                (slot_of[next], in_slot[slot]) = (slot, Some(next));
                next += 1;
            }
            // A request of one token leaves after its prefill, as one done after a step.
            for (slot, r) in in_slot.iter_mut().enumerate() {
                if r.is_some_and(|i| tokens[i].len() == reqs[i].out) {
                    slots.leave(slot).unwrap();
                    *r = None;
                }
            }
            if slots.occupied() > 0 {
                let before = slots.columns();
                for (slot, id) in slots.step(model).unwrap() {
                    tokens[in_slot[slot].unwrap()].push(id);
                }
                columns.push((before, slots.columns()));
                for (slot, r) in in_slot.iter_mut().enumerate() {
                    if r.is_some_and(|i| tokens[i].len() == reqs[i].out) {
                        slots.leave(slot).unwrap();
                        *r = None;
                    }
                }
            }
            step += 1;
        }
        Served {
            tokens,
            slot_of,
            columns,
            padded,
        }
    }

    struct Served {
        tokens: Vec<Vec<u32>>,
        slot_of: Vec<usize>,
        columns: Vec<(usize, usize)>,
        padded: bool,
    }

    /// Serves `reqs` through 3 slots of each model of `specs` (random weights, fp32, on
    /// `device`) and checks every request's ids against its prompt generated alone; that
    /// every slot was reused, the columns compacted, and a prompt longer than the columns so
    /// far joined a running batch. The GPU test runs it on the decode kernels.
    pub(crate) fn check_offline_ids(specs: &[ModelSpec], reqs: &[Req], device: &Device) {
        for spec in specs {
            let name = &spec.name;
            let source = WeightSource::Random { seed: 11 };
            let model = spec.load(&source, DType::F32, device).unwrap();
            let banned = [7u32];
            let s = serve(model.as_ref(), 3, reqs, &banned);
            let (tokens, slot_of) = (&s.tokens, &s.slot_of);
            for (i, r) in reqs.iter().enumerate() {
                let prompts = left_pad(std::slice::from_ref(&r.prompt), 0, device).unwrap();
                let g = Greedy {
                    new_tokens: r.out,
                    banned: banned.to_vec(),
                };
                let alone = generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap();
                let slot = slot_of[i];
                assert_eq!(tokens[i], alone[0], "{name} request {i} (slot {slot})");
            }
            for slot in 0..3 {
                let uses = slot_of.iter().filter(|&&s| s == slot).count();
                assert!(uses >= 2, "{name}: slot {slot} not reused: {slot_of:?}");
            }
            let compacted = s.columns.iter().any(|(before, after)| after <= before);
            assert!(compacted, "{name}: never compacted: {:?}", s.columns);
            assert!(s.padded, "{name}: no prompt longer than the columns joined");
            let banned_out = tokens.iter().flatten().any(|&id| id == 7);
            assert!(!banned_out, "{name}: a banned id");
        }
    }

    /// Item 5 of #39: every request's greedy fp32 ids under continuous batching are those of
    /// its prompt generated alone. Prompts of 2 to 9 tokens join at steps 0, 0, 2, 3, 6, 6 and
    /// 12 into 3 slots (a 9-token prompt after 6 columns pads the others; a 1-token request
    /// leaves at once); every slot is reused, and the columns are compacted once the last
    /// request runs alone.
    #[test]
    fn every_request_gets_the_ids_of_its_prompt_generated_alone() {
        let reqs = [
            req(0, 5, 6, 1),
            req(0, 3, 2, 2),
            req(2, 9, 5, 3),
            req(3, 2, 1, 4),
            req(3, 4, 7, 5),
            req(6, 7, 4, 6),
            req(6, 6, 9, 7),
            req(12, 3, 8, 8),
        ];
        let specs = ["gpt2-tiny", "bloom-tiny"].map(|n| ModelSpec::preset(n).unwrap());
        check_offline_ids(&specs, &reqs, &Device::Cpu);
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let spec = ModelSpec::preset("gpt2-tiny").unwrap();
        let model = spec
            .load(&WeightSource::Random { seed: 1 }, DType::F32, &Device::Cpu)
            .unwrap();
        let m = model.as_ref();
        let mut slots = Slots::new(m, 2, 8, 0, vec![]).unwrap();
        assert!(slots.step(m).is_err(), "a step with no request");
        assert!(
            slots.join(m, 0, &[1; 8]).is_err(),
            "no room for a new token"
        );
        assert!(slots.join(m, 2, &[1, 2]).is_err(), "no slot 2");
        slots.join(m, 0, &[1, 2]).unwrap();
        assert!(slots.join(m, 0, &[3]).is_err(), "slot 0 taken");
        assert!(slots.leave(1).is_err(), "slot 1 empty");
        for _ in 0..6 {
            slots.step(m).unwrap(); // 2 + 6 = 8 tokens cached at most: prompt + output − 1 < 8
        }
        let err = slots.step(m).unwrap_err().to_string();
        assert!(err.contains("should have left"), "{err}");
        let too_long = Slots::new(m, 2, m.max_positions() + 1, 0, vec![]);
        assert!(too_long.is_err());
    }
}
