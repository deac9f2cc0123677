//! Generation scenarios: greedy decoding with a KV cache, every engine on the same prompts,
//! batches and padding, exactly N new tokens per prompt (no stop at EOS, so the work is fixed).
//!
//! - LAMBADA the way FasterTransformer's `bloom_lambada.py` benchmarks it (`--suite lambada
//!   --mode generate`): per batch, the passages' contexts left-padded, as many new tokens as
//!   the batch's longest target; a passage is correct when its generated ids start with the
//!   target's ids. Time: the sum of the generation calls (device synchronized).
//!
//! Both time their calls again, whole passes, until `--min-time` and `--min-batches`
//! ([`super::passes`]); accuracy is over the first pass.
//! - The generation suite (`--suite generation`): prompts of `--prompt-lens` tokens cut from
//!   the suite's text, `--new-tokens` each, every token timed: time to first token (the
//!   prefill), inter-token latency, decode tokens/s. Metrics: [`crate::metrics::GenTotals`].

use super::lambada::tokenize;
use super::passes::{Passes, Slot};
use super::skeleton::{
    base_header, candle_device, choose_config, cold_share, engine_args, engine_runs, final_memory,
    finish_log, first_of_each_shape, gpu_index, group_stops, open_log, warm_short_last,
    warmup_batches, GpuWatch, Padding, PROBE_SHAPES,
};
use super::spec::{GenerateOptions, GenerateSource, RunSpec};
use crate::data::sha256_hex;
use crate::device::DeviceSpec;
use crate::engines::registry;
use crate::engines::{EngineKind, Generate, GenerateRequest};
use crate::env::EnvReport;
use crate::error::{message_without_backtrace, Error, Result};
use crate::log::{RankLog, RunOutcome};
use crate::metrics::GenTotals;
use crate::models::{Architecture, WeightSource};
use crate::record::{
    DataInfo, GenBatchRecord, GenPassage, GenerationInfo, Header, Record, Summary,
};
use crate::tokenizer::TextTokenizer;
use crate::trackers::StepClock;
use std::time::Instant;

/// One generation call's input; `targets` (LAMBADA) are what a correct continuation starts with.
struct GenBatch {
    prompts: Vec<Vec<u32>>,
    /// What the prompts are left-padded to (`--pad-multiple`).
    padded_len: usize,
    new_tokens: usize,
    /// (line index, target ids) per prompt; empty for the text source.
    targets: Vec<(usize, Vec<u32>)>,
}

/// Generates with each engine `spec` names, in order; one outcome per engine.
pub fn run(spec: &RunSpec, opts: &GenerateOptions) -> Result<Vec<RunOutcome<Summary>>> {
    engine_runs(spec)?
        .iter()
        .map(|(kind, weights)| run_engine(spec, opts, *kind, weights))
        .collect()
}

/// The id padding takes and the EOS ids generation never picks: GPT-2 pads with its EOS
/// (50256, as HF's generation examples do); BLOOM has its own pad (3) and EOS (2).
pub fn special_ids(arch: &Architecture) -> (u32, Vec<u32>) {
    match arch {
        Architecture::Gpt2(_) => (50256, vec![50256]),
        Architecture::Bloom(_) => (3, vec![2]),
    }
}

fn start(spec: &RunSpec, kind: EngineKind, weights: &WeightSource) -> Result<Box<dyn Generate>> {
    let open = || candle_device(spec);
    registry::open_generate(kind, &engine_args(spec, weights, &open))
}

/// LAMBADA: the contexts of `--batch-size` passages a call, left-truncated so that context +
/// new tokens fit the model (and `--seq-len`).
fn lambada_batches(spec: &RunSpec, tok: &TextTokenizer, max_pos: usize) -> Result<Vec<GenBatch>> {
    let mut passages = crate::data::lambada_passages(&spec.data)?;
    if let Some(n) = spec.limit {
        passages.truncate(n);
    }
    let limit = spec.seq_len.unwrap_or(max_pos).min(max_pos);
    let requests = tokenize(spec, tok, &passages, limit)?;
    Ok(requests
        .chunks(spec.batch_size.max(1))
        .map(|chunk| {
            let new_tokens = chunk
                .iter()
                .map(|r| r.target_tokens.len())
                .max()
                .unwrap_or(1);
            let keep = limit.saturating_sub(new_tokens).max(1);
            let prompts: Vec<Vec<u32>> = chunk
                .iter()
                .map(|r| {
                    let c = &r.context_tokens;
                    c[c.len().saturating_sub(keep)..].to_vec()
                })
                .collect();
            let targets = chunk
                .iter()
                .map(|r| (r.index, r.target_tokens.clone()))
                .collect();
            GenBatch {
                padded_len: padding(spec, max_pos, new_tokens).len(longest(&prompts)),
                prompts,
                new_tokens,
                targets,
            }
        })
        .collect())
}

/// The generation suite: consecutive windows of `prompt_len` tokens of the text, `batch_size`
/// prompts a call, `warm-up + batches` calls (the text is reused from its start if short).
fn text_batches(
    spec: &RunSpec,
    tok: &TextTokenizer,
    text: &str,
    (prompt_len, new_tokens, max_pos): (usize, usize, usize),
    batches: usize,
) -> Result<Vec<GenBatch>> {
    let ids = tok.encode(text)?;
    if ids.len() < prompt_len {
        return Err(Error::Config(format!(
            "the text has {} tokens, fewer than one prompt of {prompt_len}: lower --prompt-lens or give a longer --data",
            ids.len()
        )));
    }
    let windows: Vec<&[u32]> = ids.chunks_exact(prompt_len).collect();
    let mut next = windows.iter().cycle();
    let calls = spec.warmup_batches + batches;
    let padded_len = padding(spec, max_pos, new_tokens).len(prompt_len);
    Ok((0..calls)
        .map(|_| GenBatch {
            prompts: (0..spec.batch_size)
                .map(|_| next.next().expect("cycle").to_vec())
                .collect(),
            padded_len,
            new_tokens,
            targets: vec![],
        })
        .collect())
}

/// `--pad-multiple` for prompts followed by `new_tokens`: the cache holds both, so the padded
/// prompt stops `new_tokens` short of the model's positions.
fn padding(spec: &RunSpec, max_pos: usize, new_tokens: usize) -> Padding {
    Padding {
        multiple: spec.pad_multiple,
        cap: max_pos.saturating_sub(new_tokens),
    }
}

fn longest(prompts: &[Vec<u32>]) -> usize {
    prompts.iter().map(Vec::len).max().unwrap_or(0)
}

/// The calls of the run, and how the log describes them.
fn batches(
    spec: &RunSpec,
    opts: &GenerateOptions,
    tok: &TextTokenizer,
    max_pos: usize,
) -> Result<(Vec<GenBatch>, GenerationInfo, DataInfo)> {
    let (pad_id, eos_ids) = special_ids(&spec.model.arch);
    let (batches, info, data) = match &opts.source {
        GenerateSource::Lambada => {
            let b = lambada_batches(spec, tok, max_pos)?;
            let n = b.iter().map(|b| b.prompts.len()).sum();
            let data = super::lambada::data_info(spec, n);
            (b, ("lambada", None, None, false), data)
        }
        GenerateSource::Text {
            text,
            origin,
            prompt_len,
            new_tokens,
            batches,
        } => {
            crate::models::generate::check_lengths(*prompt_len, *new_tokens, max_pos)?;
            let lens = (*prompt_len, *new_tokens, max_pos);
            let b = text_batches(spec, tok, text, lens, *batches)?;
            let data = DataInfo {
                path: origin.clone(),
                sha256: sha256_hex(text.as_bytes()),
                n_samples: b.iter().map(|b| b.prompts.len()).sum(),
                matches_reference: None,
            };
            (
                b,
                ("text", Some(*new_tokens), Some(*prompt_len), true),
                data,
            )
        }
    };
    let (source, new_tokens, prompt_len, timed_steps) = info;
    let info = GenerationInfo {
        source: source.into(),
        new_tokens,
        prompt_len,
        timed_steps,
        pad_id,
        eos_ids,
    };
    Ok((batches, info, data))
}

fn run_engine(
    spec: &RunSpec,
    opts: &GenerateOptions,
    kind: EngineKind,
    weights: &WeightSource,
) -> Result<RunOutcome<Summary>> {
    let wall = Instant::now();
    let tokenizer =
        TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;
    let mut engine = start(spec, kind, weights)?;
    let (batches, info, data) = batches(spec, opts, &tokenizer, engine.max_positions())?;
    let (warm, timed) = split_warmup(spec, &info, &batches);
    let probe: Vec<GenerateRequest> = first_of_each_shape(&padded_lens(&batches), PROBE_SHAPES)
        .into_iter()
        .map(|i| request(&batches[i], &info))
        .collect();
    let shapes = |calls: &[&GenBatch]| -> Vec<(usize, usize, usize)> {
        calls.iter().map(|b| shape(b)).collect()
    };
    // Only the first pass meets a shape first: the passes the count asks spread it.
    let passes = spec.min_run.least_passes(timed.len());
    let cold = cold_share(&shapes(&timed), &shapes(&warm)) / passes as f64;
    choose_config(spec, kind, probe.len(), || {
        engine.choose_config(&probe, cold)?;
        Ok(engine.info())
    })?;
    let host = EnvReport::collect();
    let header = Header {
        engine: engine.name().into(),
        engine_info: engine.info(),
        gpu_index: match spec.device {
            DeviceSpec::Cuda(_) => gpu_index(spec.device, None, &host),
            DeviceSpec::Cpu => None,
        },
        seed: match spec.weights {
            WeightSource::Random { seed } => Some(seed),
            WeightSource::Dir(_) => None,
        },
        limit: spec.limit,
        load_seconds: engine.load_seconds(),
        seq_len: spec.seq_len,
        generation: Some(info.clone()),
        warmup_batches: warm.len(),
        ..base_header(spec, weights, &tokenizer, host, data)
    };
    let mut log = open_log(spec, &header)?;
    let calls = Calls { warm, timed };
    let mut out = generate_all(spec, &header, &info, engine.as_mut(), &calls, &mut log)?;
    let failure = out.failure.take();
    let mem = final_memory(engine.as_mut(), failure.is_some());
    let message = failure
        .as_ref()
        .map(|e| message_without_backtrace(&e.to_string()));
    let summary = out.gpu.apply(Summary {
        compiles_timed: out.compiles,
        ..out.totals.summary(
            message,
            wall.elapsed().as_secs_f64(),
            mem,
            out.kv_cache_bytes,
        )
    });
    finish_log(log, header, summary, Record::Summary, failure)
}

/// What the generation calls of a run left.
struct Generated {
    totals: GenTotals,
    gpu: super::skeleton::GpuFigures,
    kv_cache_bytes: Option<u64>,
    /// The engine's compilations inside the timed calls (compiled HF).
    compiles: Option<u64>,
    failure: Option<Error>,
}

/// The padded length of each call's prompts.
/// (rows, padded length, new tokens) of a call: what a compiled engine compiles for (the last
/// batch's fewer rows are a shape of their own).
fn shape(b: &GenBatch) -> (usize, usize, usize) {
    (b.prompts.len(), b.padded_len, b.new_tokens)
}

fn padded_lens(batches: &[GenBatch]) -> Vec<usize> {
    batches.iter().map(|b| b.padded_len).collect()
}

/// The warm-up calls and the timed ones. LAMBADA warms up on its first batches (timed again
/// afterwards, as the score mode does) and, with `--pad-multiple` above 1, on the first batch
/// of every shape (padded length, new tokens) besides; the text source made its warm-up calls
/// extra.
fn split_warmup<'a>(
    spec: &RunSpec,
    info: &GenerationInfo,
    batches: &'a [GenBatch],
) -> (Vec<&'a GenBatch>, Vec<&'a GenBatch>) {
    if info.source == "text" {
        let (warm, timed) = batches.split_at(spec.warmup_batches.min(batches.len()));
        return (warm.iter().collect(), timed.iter().collect());
    }
    let shapes: Vec<(usize, usize, usize)> = batches.iter().map(shape).collect();
    let mut warm = warmup_batches(&shapes, spec.warmup_batches, spec.pad_multiple > 1);
    warm_short_last(&mut warm, &shapes.iter().map(|s| s.0).collect::<Vec<_>>());
    (
        warm.iter().map(|&i| &batches[i]).collect(),
        batches.iter().collect(),
    )
}

/// A run's generation calls: the untimed warm-up ones, then the timed ones.
struct Calls<'a> {
    warm: Vec<&'a GenBatch>,
    timed: Vec<&'a GenBatch>,
}

/// Warm-up calls (untimed: PTX load, cuBLAS handles, HF's compilation for each new shape),
/// then every call timed and logged as it finishes, pass after pass until the run's minimums
/// are reached.
fn generate_all(
    spec: &RunSpec,
    header: &Header,
    info: &GenerationInfo,
    engine: &mut dyn Generate,
    calls: &Calls,
    log: &mut RankLog,
) -> Result<Generated> {
    let (warm, timed) = (&calls.warm, &calls.timed);
    let mut failure = warm.iter().find_map(|b| {
        let mut clock = StepClock::new(info.timed_steps);
        engine.generate(&request(b, info), &mut clock).err()
    });
    let watch = GpuWatch::start(spec.device, header.gpu_index, engine.pid());
    let compiled_before = engine.compiles();
    let mut totals = GenTotals::default();
    let mut kv_cache_bytes = None;
    let n_prompts: usize = timed.iter().map(|b| b.prompts.len()).sum();
    let bar = crate::progress::passages(spec.progress && spec.is_logging_rank(), n_prompts as u64);
    let mut passes = Passes::new(spec.min_run, timed.len());
    while let Some(slot) = passes.next(|stop| group_stops(spec, stop))? {
        if failure.is_some() {
            break;
        }
        if slot.pass > 0 && slot.index == 0 {
            bar.inc_length(n_prompts as u64);
        }
        let b = timed[slot.index];
        let record = match generate_one(engine, slot, b, &request(b, info), info.timed_steps) {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        passes.timed(record.latency_ms);
        kv_cache_bytes = kv_cache_bytes.max(engine.kv_cache_bytes());
        totals.add(&record);
        log.write(&Record::GenBatch(record))?;
        bar.inc(b.prompts.len() as u64);
    }
    bar.finish_and_clear();
    Ok(Generated {
        totals,
        gpu: GpuWatch::stop(watch),
        kv_cache_bytes,
        compiles: engine.compiles().zip(compiled_before).map(|(a, b)| a - b),
        failure,
    })
}

/// The engine's request for one call.
fn request<'a>(b: &'a GenBatch, info: &'a GenerationInfo) -> GenerateRequest<'a> {
    GenerateRequest {
        prompts: &b.prompts,
        padded_len: b.padded_len,
        new_tokens: b.new_tokens,
        pad_id: info.pad_id,
        eos_ids: &info.eos_ids,
    }
}

/// One call, checked (a row per prompt, `new_tokens` ids each) and turned into its record
/// (its passages on the first pass only: later ones repeat them).
fn generate_one(
    engine: &mut dyn Generate,
    slot: Slot,
    b: &GenBatch,
    req: &GenerateRequest,
    timed_steps: bool,
) -> Result<GenBatchRecord> {
    let mut clock = StepClock::new(timed_steps);
    let ids = engine.generate(req, &mut clock)?;
    if ids.len() != b.prompts.len() || ids.iter().any(|r| r.len() != b.new_tokens) {
        return Err(Error::Engine(format!(
            "{} returned {} rows for {} prompts of {} new tokens",
            engine.name(),
            ids.len(),
            b.prompts.len(),
            b.new_tokens
        )));
    }
    let targets: &[(usize, Vec<u32>)] = if slot.pass == 0 { &b.targets } else { &[] };
    let passages = targets
        .iter()
        .zip(&ids)
        .map(|((index, target), ids)| GenPassage {
            index: *index,
            correct: ids.starts_with(target),
            generated: ids.clone(),
        })
        .collect();
    Ok(GenBatchRecord {
        batch: slot.seq,
        pass: slot.pass,
        n_samples: b.prompts.len(),
        prompt_len: longest(&b.prompts),
        padded_len: Some(b.padded_len),
        n_prompt_tokens: b.prompts.iter().map(Vec::len).sum(),
        new_tokens: b.new_tokens,
        latency_ms: clock.total_ms(),
        ttft_ms: clock.first_ms(),
        itl_ms: clock.between_ms(),
        passages,
    })
}
