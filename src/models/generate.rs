//! Greedy decoding of a batch of prompts with a KV cache, HF `generate`'s semantics with
//! `do_sample=False, min_new_tokens = max_new_tokens = N`: prompts left-padded, exactly N new
//! tokens per row (no stop at EOS, so the work is fixed), each the argmax of the last logits
//! (EOS banned, as `min_new_tokens` does, when the caller names it).
//!
//! One prefill (the padded prompts into an empty cache, giving the first new token; on CUDA in
//! bf16 / f16 with `--fused prefill` only their real tokens, end to end:
//! [`CausalLm::prefill_packed`]), then N − 1 decode steps of one token each. The generated
//! ids stay on the device until the end, so the loop never waits for the device; an engine
//! that times the phases passes a hook, called after each phase is queued, that synchronises
//! and reads its clock (time to first token, inter-token latency) without this loop knowing
//! about timing.
//!
//! Shapes: `B` batch, `T` padded prompt length, `N` new tokens, `V` vocab.

use super::{CausalLm, KvCache};
use crate::error::{Error, Result};
use crate::kernels::Record;
use candle_core::{DType, Device, Tensor};

/// A batch of prompts, left-padded to the longest.
#[derive(Clone, Debug)]
pub struct Prompts {
    /// (B, T) u32, padding positions hold the pad id.
    pub ids: Tensor,
    /// (B, T) u32, 1 for real tokens, 0 for padding.
    pub mask: Tensor,
    /// Real tokens of each row.
    pub lens: Vec<usize>,
}

impl Prompts {
    /// Padded length T.
    pub fn len(&self) -> usize {
        self.ids.dims().get(1).copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows B.
    pub fn batch(&self) -> usize {
        self.ids.dims().first().copied().unwrap_or(0)
    }
}

/// Left-pads `prompts` to the longest with `pad_id` (as HF's tokenizer with
/// `padding_side="left"`): row b is `[pad; T - len_b] ++ prompt_b`, its mask `[0; T - len_b] ++
/// [1; len_b]`.
pub fn left_pad(prompts: &[Vec<u32>], pad_id: u32, device: &Device) -> Result<Prompts> {
    left_pad_to(prompts, pad_id, 0, device)
}

/// [`left_pad`] to T = max(`padded_len`, the longest prompt) positions (`--pad-multiple`).
pub fn left_pad_to(
    prompts: &[Vec<u32>],
    pad_id: u32,
    padded_len: usize,
    device: &Device,
) -> Result<Prompts> {
    if prompts.is_empty() {
        return Err(Error::Config(
            "no prompts to generate from: pass at least one".into(),
        ));
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
        return Err(Error::Config(format!(
            "prompt {i} is empty: every prompt needs at least one token"
        )));
    }
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let t = lens.iter().copied().max().unwrap_or(0).max(padded_len);
    let (mut ids, mut mask) = (Vec::with_capacity(t * lens.len()), Vec::new());
    for p in prompts {
        let pad = t - p.len();
        ids.extend(std::iter::repeat_n(pad_id, pad).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(0u32, pad).chain(std::iter::repeat_n(1, p.len())));
    }
    let b = lens.len();
    Ok(Prompts {
        ids: Tensor::from_vec(ids, (b, t), device)?,
        mask: Tensor::from_vec(mask, (b, t), device)?,
        lens,
    })
}

/// Where a generation is when its hook is called: the phase's work is queued on the device,
/// not necessarily finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The prompts are in the cache and the first new token chosen.
    Prefill,
    /// Decode step `step` (1 to N − 1) has chosen new token `step + 1`.
    Decode { step: usize },
}

/// What to generate after the prompts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Greedy {
    /// New tokens per row, N ≥ 1.
    pub new_tokens: usize,
    /// Token ids never chosen. HF generates exactly N tokens with `min_new_tokens = N`, which
    /// bans the EOS ids for all N (`MinNewTokensLengthLogitsProcessor`): pass them here to
    /// choose what HF chooses.
    pub banned: Vec<u32>,
}

/// Rejects requests the model cannot serve: 0 new tokens, or a padded prompt of `prompt_len`
/// plus `new_tokens` beyond the model's `max_positions` (the cache holds every position).
pub fn check_lengths(prompt_len: usize, new_tokens: usize, max_positions: usize) -> Result<()> {
    if new_tokens == 0 {
        return Err(Error::Config(
            "0 new tokens to generate: ask for at least 1".into(),
        ));
    }
    if prompt_len + new_tokens > max_positions {
        return Err(Error::Config(format!(
            "a prompt of {prompt_len} tokens + {new_tokens} new tokens needs {} positions, the model has {max_positions}: use shorter prompts or fewer new tokens",
            prompt_len + new_tokens
        )));
    }
    Ok(())
}

/// Greedy decoding after each prompt, in a cache made for it. Returns the generated ids,
/// `g.new_tokens` per row. `hook` is called after each phase.
pub fn generate(
    model: &dyn CausalLm,
    prompts: &Prompts,
    g: &Greedy,
    hook: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<Vec<Vec<u32>>> {
    check_lengths(prompts.len(), g.new_tokens, model.max_positions())?;
    let mut cache = model.new_cache(prompts.batch(), prompts.len() + g.new_tokens)?;
    generate_in(model, &mut cache, prompts, g, hook)
}

/// [`generate`] in an existing cache (emptied first), so that a benchmark loop reuses one
/// allocation. The cache must have `prompts.batch()` rows and room for
/// `prompts.len() + g.new_tokens` positions.
pub fn generate_in(
    model: &dyn CausalLm,
    cache: &mut KvCache,
    prompts: &Prompts,
    g: &Greedy,
    hook: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<Vec<Vec<u32>>> {
    check_lengths(prompts.len(), g.new_tokens, model.max_positions())?;
    let (b, need) = (prompts.batch(), prompts.len() + g.new_tokens);
    if cache.batch() != b || cache.max_len() < need {
        return Err(Error::Config(format!(
            "the KV cache holds {} rows of {} positions, this batch needs {b} rows of {need}: make it with new_cache({b}, {need})",
            cache.batch(),
            cache.max_len(),
        )));
    }
    cache.reset()?;
    let (ids, mask) = (&prompts.ids, &prompts.mask);
    let logits = match model.prefill_packed(ids, &prompts.lens, cache)? {
        Some(logits) => logits, // (B, V): the real tokens only, end to end
        None => model.forward_cached(ids, mask, cache)?, // (B, V)
    };
    let picker = Picker::new(&g.banned, &logits)?;
    let pick = |logits: Tensor| picker.pick(&logits);
    let mut next = pick(logits)?;
    hook(Phase::Prefill)?;
    let real = Tensor::ones((b, 1), DType::U32, prompts.ids.device())?; // (B, 1)
    let graphed = g.new_tokens >= GRAPH_MIN_TOKENS && cache.max_len() <= GRAPH_MAX_LEN;
    if graphed && model.graph_capturable() && cache.start_device_cursor()? {
        let step = |ids: &Tensor, cache: &mut KvCache, record: Option<Record>| -> Result<bool> {
            let logits = model.forward_cached(ids, &real, cache)?; // (B, V)
            if picker.pick_into(&logits, ids, record)? {
                return Ok(true);
            }
            Ok(ids.slice_set(&pick(logits)?, 0, 0).map(|()| false)?) // (B, 1)
        };
        return decode_graphed(cache, next, g.new_tokens, &step, hook);
    }
    let mut tokens = Vec::with_capacity(g.new_tokens);
    for step in 1..g.new_tokens {
        let logits = model.forward_cached(&next, &real, cache)?; // (B, V)
        tokens.push(next);
        next = pick(logits)?;
        hook(Phase::Decode { step })?;
    }
    tokens.push(next);
    Ok(Tensor::cat(&tokens, 1)?.to_vec2::<u32>()?) // (B, N)
}

/// Fewer new tokens than this decode eagerly: a graph's capture costs about two steps.
const GRAPH_MIN_TOKENS: usize = 8;
/// Caches longer than this decode eagerly: the decode kernel keeps a score per position in
/// shared memory (48 KiB a block).
const GRAPH_MAX_LEN: usize = 8192;

/// A graphed decode step: the ids (B, 1) it reads and overwrites with its picks, the cache,
/// and where the picks are recorded on the device; true where they were (`--fused step-io`).
type GraphStep<'a> = dyn Fn(&Tensor, &mut KvCache, Option<Record>) -> Result<bool> + 'a;

/// Decode steps 1 to N − 1 after the prefill chose `first` (B, 1): step 1 eagerly (every
/// kernel loaded), then `step` recorded as a CUDA graph and replayed for the others, the ids
/// going from one replay to the next in one device buffer, and each step's picks into a
/// (B, N) record on the device where the step writes it (else copied out after each step).
/// Where the capture fails (or there is no graph, as on the CPU), the steps run eagerly.
fn decode_graphed(
    cache: &mut KvCache,
    first: Tensor,
    n: usize,
    step: &GraphStep<'_>,
    hook: &mut dyn FnMut(Phase) -> Result<()>,
) -> Result<Vec<Vec<u32>>> {
    let ids = first.copy()?; // (B, 1) u32: the step's input, overwritten with its output
                             // Step 1 fills candle's parameter cache with every layout the capture will ask for.
    let _params = crate::kernels::param_cache(ids.device());
    let mut tokens = vec![ids.copy()?];
    // (B, N) u32: column 0 the prefill's pick, column s step s's (at cursor base + s).
    let record = Tensor::zeros((ids.dim(0)?, n), DType::U32, ids.device())?;
    record.slice_set(&ids, 1, 0)?;
    let (base, cursor) = (cache.len() as u32, cache.device_cursor().cloned());
    let counters = Tensor::zeros(ids.dim(0)?, DType::U32, ids.device())?; // (B,)
    let at = || -> Option<Record<'_>> {
        Some(Record {
            tokens: &record,
            cursor: cursor.as_ref()?,
            base,
            counters: &counters,
        })
    };
    // Whether the steps record their picks: then the ids are not copied out between them.
    let recorded = step(&ids, cache, at())? && cursor.is_some();
    hook(Phase::Decode { step: 1 })?;
    let graph = match crate::kernels::capture(ids.device(), || {
        step(&ids, cache, at())
            .map(|_| ())
            .map_err(candle_core::Error::wrap)
    }) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("note: decoding without a CUDA graph (the capture failed: {e})");
            None
        }
    };
    cache.sync_from_device()?; // the capture counted a step on the host that did not run
    for s in 2..n {
        if !recorded {
            tokens.push(ids.copy()?);
        }
        match &graph {
            Some(g) => g.launch()?,
            None => {
                step(&ids, cache, at())?;
            }
        }
        hook(Phase::Decode { step: s })?;
    }
    cache.sync_from_device()?;
    if recorded {
        return Ok(record.to_vec2::<u32>()?); // (B, N)
    }
    tokens.push(ids.copy()?);
    Ok(Tensor::cat(&tokens, 1)?.to_vec2::<u32>()?) // (B, N)
}

/// The greedy choice: the argmax of each row's logits, the banned ids never chosen.
pub struct Picker {
    /// (1, V): −inf at the banned ids, 0 elsewhere; None when none is banned.
    ban: Option<Tensor>,
}

impl Picker {
    /// A picker for logits like `logits` (B, V): its vocabulary, dtype and device.
    pub fn new(banned: &[u32], logits: &Tensor) -> Result<Self> {
        Ok(Self {
            ban: ban_bias(banned, logits)?,
        })
    }

    /// The chosen ids written into `ids` ((B, 1) u32, in place) and into `record` where given,
    /// by the pick's kernel (`--fused step-io`); false, nothing written, where it does not
    /// apply ([`Picker::pick`] and a copy then).
    pub fn pick_into(&self, logits: &Tensor, ids: &Tensor, record: Option<Record>) -> Result<bool> {
        Ok(crate::kernels::argmax_into(
            logits,
            self.ban.as_ref(),
            ids,
            record,
        )?)
    }

    /// logits (B, V) -> the chosen ids, (B, 1) u32 on the logits' device.
    pub fn pick(&self, logits: &Tensor) -> Result<Tensor> {
        if let Some(ids) = crate::kernels::argmax(logits, self.ban.as_ref())? {
            return Ok(ids); // (B, 1) u32, one kernel on CUDA
        }
        let logits = match &self.ban {
            Some(ban) => logits.broadcast_add(ban)?,
            None => logits.clone(),
        };
        Ok(logits.argmax_keepdim(1)?) // (B, 1) u32
    }
}

/// −inf at the banned ids, 0 elsewhere: (1, V) in the logits' dtype; None when none is banned.
fn ban_bias(banned: &[u32], logits: &Tensor) -> Result<Option<Tensor>> {
    if banned.is_empty() {
        return Ok(None);
    }
    let v = logits.dim(1)?;
    if let Some(&id) = banned.iter().find(|&&id| id as usize >= v) {
        return Err(Error::Config(format!(
            "banned token id {id} is outside the vocabulary of {v}: check the EOS id against the model"
        )));
    }
    let mut bias = vec![0f32; v];
    for &id in banned {
        bias[id as usize] = f32::NEG_INFINITY;
    }
    let bias = Tensor::from_vec(bias, (1, v), logits.device())?;
    Ok(Some(bias.to_dtype(logits.dtype())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::test_ranks::on_ranks;
    use crate::models::{ModelSpec, WeightSource};

    /// Each rank of a tensor-parallel group caches its own heads and generates the ids of
    /// the single-rank model (3 ranks split 4 heads 1, 1, 2).
    #[test]
    fn tensor_parallel_ranks_generate_the_single_rank_ids() {
        for name in ["gpt2-tiny", "bloom-tiny"] {
            let spec = ModelSpec::preset(name).unwrap();
            let run = |size: usize| {
                let spec = spec.clone();
                on_ranks(size, move |tp| {
                    let source = WeightSource::Random { seed: 3 };
                    let model = spec
                        .load_shard(&source, DType::F32, &Device::Cpu, &tp)
                        .unwrap();
                    let prompts = [vec![464, 3290, 318, 257, 1049], vec![40, 588]];
                    let prompts = left_pad(&prompts, 0, &Device::Cpu).unwrap();
                    let g = Greedy {
                        new_tokens: 5,
                        banned: vec![],
                    };
                    let ids = generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap();
                    let bytes = model.new_cache(2, 10).unwrap().bytes();
                    (ids, bytes)
                })
            };
            let one = run(1).remove(0);
            for size in [2, 3] {
                let ranks = run(size);
                for (rank, (ids, _)) in ranks.iter().enumerate() {
                    assert_eq!(ids, &one.0, "{name} tp{size} rank {rank}");
                }
                let heads: Vec<usize> = (0..size)
                    .map(|r| crate::dist::part(4, r, size).len())
                    .collect();
                let bytes: Vec<usize> = ranks.iter().map(|r| r.1).collect();
                let want: Vec<usize> = heads.iter().map(|h| one.1 / 4 * h).collect();
                assert_eq!(bytes, want, "{name} tp{size}: KV cache bytes per rank");
            }
        }
    }

    #[test]
    fn left_pad_puts_padding_before_each_prompt() -> Result<()> {
        let p = left_pad(&[vec![5, 6, 7], vec![8]], 0, &Device::Cpu)?;
        assert_eq!(p.ids.to_vec2::<u32>()?, [[5, 6, 7], [0, 0, 8]]);
        assert_eq!(p.mask.to_vec2::<u32>()?, [[1, 1, 1], [0, 0, 1]]);
        assert_eq!((p.batch(), p.len()), (2, 3));
        Ok(())
    }

    #[test]
    fn left_pad_to_pads_past_the_longest_prompt() -> Result<()> {
        let p = left_pad_to(&[vec![5, 6, 7], vec![8]], 0, 5, &Device::Cpu)?;
        assert_eq!(p.ids.to_vec2::<u32>()?, [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8]]);
        assert_eq!(p.mask.to_vec2::<u32>()?, [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]);
        // Shorter than the longest prompt: the longest wins.
        assert_eq!(left_pad_to(&[vec![5, 6, 7]], 0, 2, &Device::Cpu)?.len(), 3);
        Ok(())
    }

    #[test]
    fn empty_prompts_are_refused() {
        let err = left_pad(&[vec![1], vec![]], 0, &Device::Cpu).unwrap_err();
        assert_eq!(
            err.to_string(),
            "prompt 1 is empty: every prompt needs at least one token"
        );
        assert!(left_pad(&[], 0, &Device::Cpu).is_err());
    }

    #[test]
    fn lengths_beyond_the_model_are_one_line_errors() {
        let zero = check_lengths(4, 0, 64).unwrap_err().to_string();
        assert_eq!(zero, "0 new tokens to generate: ask for at least 1");
        let long = check_lengths(60, 5, 64).unwrap_err().to_string();
        assert!(
            long.contains("needs 65 positions, the model has 64"),
            "{long}"
        );
        assert!(!long.contains('\n'));
        assert!(check_lengths(60, 4, 64).is_ok());
    }
}
