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
use super::passes::Slot;
use super::skeleton::{
    base_header, cold_share, first_of_each_shape, probe_status, warm_short_last, warmup_batches,
    Opened, Padding, Timed, PROBE_SHAPES,
};
use super::spec::{GenerateOptions, GenerateSource, RunSpec};
use crate::data::sha256_hex;
use crate::engines::registry::{self, EngineArgs};
use crate::engines::{EngineKind, Generate, GenerateRequest};
use crate::env::EnvReport;
use crate::error::{Error, Result};
use crate::metrics::GenTotals;
use crate::models::Architecture;
use crate::record::{
    describe_hf_config, DataInfo, GenBatchRecord, GenPassage, GenerationInfo, Header, Record,
    Summary,
};
use crate::tokenizer::TextTokenizer;
use crate::trackers::StepClock;

/// One generation call's input; `targets` (LAMBADA) are what a correct continuation starts with.
struct GenBatch {
    prompts: Vec<Vec<u32>>,
    /// What the prompts are left-padded to (`--pad-multiple`).
    padded_len: usize,
    new_tokens: usize,
    /// (line index, target ids) per prompt; empty for the text source.
    targets: Vec<(usize, Vec<u32>)>,
}

/// Greedy generation, timed in passes ([`Timed`]).
pub struct Generation<'a>(pub &'a GenerateOptions);

/// A generating engine's run: its calls, how the log describes them, and the largest KV cache
/// the timed calls used.
pub struct Job {
    batches: Vec<GenBatch>,
    info: GenerationInfo,
    /// Indices into `batches`: the untimed warm-up calls, then the timed ones.
    warm: Vec<usize>,
    timed: Vec<usize>,
    kv_cache_bytes: Option<u64>,
}

impl Timed for Generation<'_> {
    type Engine = dyn Generate;
    type Job = Job;
    type Record = GenBatchRecord;
    type Totals = GenTotals;
    type Warm<'a>
        = (GenerateRequest<'a>, bool)
    where
        Self: 'a;

    fn start(
        &self,
        spec: &RunSpec,
        kind: EngineKind,
        args: &EngineArgs,
    ) -> Result<(Opened<Self>, Header)> {
        let tokenizer =
            TextTokenizer::for_model(spec.tokenizer_dir.as_deref(), spec.model.architecture())?;
        let mut engine = registry::open_generate(kind, args)?;
        let (batches, info, data) = batches(
            spec,
            args.progress,
            self.0,
            &tokenizer,
            engine.max_positions(),
        )?;
        let (warm, timed) = split_warmup(spec, &info, &batches);
        let probe: Vec<GenerateRequest> = first_of_each_shape(&padded_lens(&batches), PROBE_SHAPES)
            .into_iter()
            .map(|i| request(&batches[i], &info))
            .collect();
        let shapes = |calls: &[usize]| -> Vec<(usize, usize, usize)> {
            calls.iter().map(|&i| shape(&batches[i])).collect()
        };
        // Only the first pass meets a shape first: the passes the count asks spread it.
        let passes = spec.min_run.least_passes(timed.len());
        let cold = cold_share(&shapes(&timed), &shapes(&warm)) / passes as f64;
        let probes = registry::entry(kind).probes;
        let status = probe_status(probes, &spec.hf, args.progress, probe.len());
        engine.choose_config(&probe, cold)?;
        status.done(format!("HF ran {}", describe_hf_config(&engine.info())));
        let host = EnvReport::collect();
        let header = Header {
            engine: engine.name().into(),
            engine_info: engine.info(),
            limit: spec.limit,
            load_seconds: engine.load_seconds(),
            seq_len: spec.seq_len,
            generation: Some(info.clone()),
            warmup_batches: warm.len(),
            ..base_header(spec, args.weights, &tokenizer, host, data)
        };
        let per_pass = timed.len();
        let rows_per_pass = timed.iter().map(|&i| batches[i].prompts.len()).sum();
        let job = Job {
            batches,
            info,
            warm,
            timed,
            kv_cache_bytes: None,
        };
        let opened = Opened {
            engine,
            job,
            per_pass,
            rows_per_pass,
        };
        Ok((opened, header))
    }

    fn warm_calls<'a>(&self, job: &'a Job) -> Vec<(GenerateRequest<'a>, bool)> {
        job.warm
            .iter()
            .map(|&i| (request(&job.batches[i], &job.info), job.info.timed_steps))
            .collect()
    }

    /// One call, checked (a row per prompt, `new_tokens` ids each) and turned into its record
    /// (its passages on the first pass only: later ones repeat them).
    fn step(
        &self,
        job: &mut Job,
        engine: &mut (dyn Generate + 'static),
        slot: Slot,
    ) -> Result<GenBatchRecord> {
        let b = &job.batches[job.timed[slot.index]];
        let mut clock = StepClock::new(job.info.timed_steps);
        let ids = engine.generate(&request(b, &job.info), &mut clock)?;
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
        let record = GenBatchRecord {
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
        };
        job.kv_cache_bytes = job.kv_cache_bytes.max(engine.kv_cache_bytes());
        Ok(record)
    }

    fn measured(record: &GenBatchRecord) -> (f64, usize) {
        (record.latency_ms, record.n_samples)
    }

    fn record(record: GenBatchRecord) -> Record {
        Record::GenBatch(record)
    }

    /// The largest KV cache of the timed calls.
    fn complete(&self, job: &Job, summary: Summary) -> Summary {
        Summary {
            kv_cache_bytes: job.kv_cache_bytes,
            ..summary
        }
    }
}

/// The id padding takes and the EOS ids generation never picks: GPT-2 pads with its EOS
/// (50256, as HF's generation examples do); BLOOM has its own pad (3) and EOS (2).
pub fn special_ids(arch: &Architecture) -> (u32, Vec<u32>) {
    match arch {
        Architecture::Gpt2(_) => (50256, vec![50256]),
        Architecture::Bloom(_) => (3, vec![2]),
    }
}

/// LAMBADA: the contexts of `--batch-size` passages a call, left-truncated so that context +
/// new tokens fit the model (and `--seq-len`).
fn lambada_batches(
    spec: &RunSpec,
    progress: bool,
    tok: &TextTokenizer,
    max_pos: usize,
) -> Result<Vec<GenBatch>> {
    let mut passages = crate::data::lambada_passages(&spec.data)?;
    if let Some(n) = spec.limit {
        passages.truncate(n);
    }
    let limit = spec.seq_len.unwrap_or(max_pos).min(max_pos);
    let requests = tokenize(progress, tok, &passages, limit)?;
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
    progress: bool,
    opts: &GenerateOptions,
    tok: &TextTokenizer,
    max_pos: usize,
) -> Result<(Vec<GenBatch>, GenerationInfo, DataInfo)> {
    let (pad_id, eos_ids) = special_ids(&spec.model.arch);
    let (batches, info, data) = match &opts.source {
        GenerateSource::Lambada => {
            let b = lambada_batches(spec, progress, tok, max_pos)?;
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

/// The padded length of each call's prompts.
/// (rows, padded length, new tokens) of a call: what a compiled engine compiles for (the last
/// batch's fewer rows are a shape of their own).
fn shape(b: &GenBatch) -> (usize, usize, usize) {
    (b.prompts.len(), b.padded_len, b.new_tokens)
}

fn padded_lens(batches: &[GenBatch]) -> Vec<usize> {
    batches.iter().map(|b| b.padded_len).collect()
}

/// The warm-up calls and the timed ones, as indices. LAMBADA warms up on its first batches
/// (timed again afterwards, as the score mode does) and, with `--pad-multiple` above 1, on the
/// first batch of every shape (padded length, new tokens) besides; the text source made its
/// warm-up calls extra.
fn split_warmup(
    spec: &RunSpec,
    info: &GenerationInfo,
    batches: &[GenBatch],
) -> (Vec<usize>, Vec<usize>) {
    if info.source == "text" {
        let w = spec.warmup_batches.min(batches.len());
        return ((0..w).collect(), (w..batches.len()).collect());
    }
    let shapes: Vec<(usize, usize, usize)> = batches.iter().map(shape).collect();
    let mut warm = warmup_batches(&shapes, spec.warmup_batches, spec.pad_multiple > 1);
    warm_short_last(&mut warm, &shapes.iter().map(|s| s.0).collect::<Vec<_>>());
    (warm, (0..batches.len()).collect())
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
