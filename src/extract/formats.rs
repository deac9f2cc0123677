//! Parsers for every log format extract-metrics reads. Each maps a file into [`RunRow`]s
//! (run metadata + numeric metrics); lines a parser does not recognise are counted, never fatal.

use super::RunRow;
use crate::record::{Record, SweepHeader, SweepRun};
use regex::Regex;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::LazyLock;

/// A log format, as `--format` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// transformer-bench's JSONL run log (every schema version so far: 1).
    BenchJsonl,
    /// HF Trainer stdout: `***** train metrics *****` blocks and `{'loss': …}` lines.
    HfTrainerLog,
    /// HF Trainer `all_results.json` / `train_results.json` / `eval_results.json`.
    HfTrainerResults,
    /// HF Trainer `trainer_state.json` (its `log_history`).
    HfTrainerState,
    /// llm.c stdout: `step …` lines in its older and newer formats, `val loss …`.
    LlmcLog,
    /// llm.c `main.log`: `s:N trl:…`, `s:N tel:…` lines.
    LlmcMainLog,
}

pub const FORMAT_NAMES: &str =
    "bench-jsonl, hf-trainer-log, hf-trainer-results, hf-trainer-state, llmc-log, llmc-main-log";

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::BenchJsonl => "bench-jsonl",
            Format::HfTrainerLog => "hf-trainer-log",
            Format::HfTrainerResults => "hf-trainer-results",
            Format::HfTrainerState => "hf-trainer-state",
            Format::LlmcLog => "llmc-log",
            Format::LlmcMainLog => "llmc-main-log",
        }
    }
}

static LLMC_NEW: LazyLock<Regex> = LazyLock::new(|| {
    // step    1/74 | loss 11.0 (+0.00z)| norm 15.4 (+0.00z)| lr 6.00e-06 | 1234.56 ms | 12.3% bf16 MFU | 12345 tok/s
    // (earlier: "| train loss 11.0 | norm 15.4 | …", without the z-scores)
    Regex::new(r"^step\s+(\d+)/(\d+)\s*\|\s*(?:train )?loss ([-\d.eE+naif]+)(?:\s*\([^)]*\))?\s*\|\s*norm ([-\d.eE+naif]+)(?:\s*\([^)]*\))?\s*\|\s*lr ([-\d.eE+]+)\s*\|\s*([\d.]+) ms\s*\|\s*([\d.]+)% bf16 MFU\s*\|\s*([\d.]+) tok/s").unwrap()
});
static LLMC_OLD_CUDA: LazyLock<Regex> = LazyLock::new(|| {
    // step 61/74: train loss 3.21 (312.0 ms, 13127 tok/s)
    Regex::new(r"^step (\d+)/(\d+): train loss ([-\d.eE+]+) \(([\d.]+) ms, ([\d.]+) tok/s\)")
        .unwrap()
});
static LLMC_OLD_C: LazyLock<Regex> = LazyLock::new(|| {
    // step 20: train loss 4.52 (took 2636.6 ms)
    Regex::new(r"^step (\d+): train loss ([-\d.eE+]+) \(took ([\d.]+) ms\)").unwrap()
});
static LLMC_VAL: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^val loss ([-\d.eE+]+)").unwrap());
static LLMC_AVG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^total average iteration time: ([\d.]+) ms").unwrap());
static LLMC_MAIN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^s:(\d+)((?: \w+:[-\d.eE+naif]+)+)\s*$").unwrap());
static HF_BLOCK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\*\*\*\*\* (\w+) metrics \*\*\*\*\*").unwrap());
static HF_METRIC: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s+(\w+)\s+=\s+(\S+)\s*$").unwrap());
static HF_DICT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\{'\w+': .*\}\s*$").unwrap());
static HF_PAIR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"'(\w+)': '?([-\d.eE+]+|nan|inf)'?").unwrap());

/// Which format a file is in, from its name and content; None if no parser knows it.
pub fn detect(path: &Path, text: &str) -> Option<Format> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if first.starts_with('{') && first.contains("\"record\"") {
        return Some(Format::BenchJsonl);
    }
    if name == "trainer_state.json"
        || (text.trim_start().starts_with('{') && text.contains("\"log_history\""))
    {
        return Some(Format::HfTrainerState);
    }
    if name.ends_with("results.json")
        || (name.ends_with(".json") && (text.contains("\"train_") || text.contains("\"eval_")))
    {
        return Some(Format::HfTrainerResults);
    }
    let lines = || text.lines().map(str::trim_end);
    if HF_BLOCK.is_match(text) || lines().any(|l| HF_DICT.is_match(l)) {
        return Some(Format::HfTrainerLog);
    }
    if lines().any(|l| LLMC_NEW.is_match(l) || LLMC_OLD_CUDA.is_match(l) || LLMC_OLD_C.is_match(l))
    {
        return Some(Format::LlmcLog);
    }
    if lines().any(|l| LLMC_MAIN.is_match(l)) {
        return Some(Format::LlmcMainLog);
    }
    None
}

/// Parses `text` as `format`: the rows and the number of lines skipped.
pub fn parse(format: Format, path: &Path, text: &str) -> (Vec<RunRow>, usize) {
    let mut row = RunRow::new(path, format);
    let skipped = match format {
        Format::BenchJsonl => return bench_jsonl(row, text),
        Format::HfTrainerLog => hf_trainer_log(&mut row, text),
        Format::HfTrainerResults => json_metrics(&mut row, text),
        Format::HfTrainerState => hf_trainer_state(&mut row, text),
        Format::LlmcLog => llmc_log(&mut row, text),
        Format::LlmcMainLog => llmc_main_log(&mut row, text),
    };
    row.meta.entry("engine".into()).or_insert_with(|| {
        match format {
            Format::HfTrainerLog | Format::HfTrainerResults | Format::HfTrainerState => {
                "hf-trainer"
            }
            _ => "llm.c",
        }
        .into()
    });
    if row.metrics.is_empty() {
        return (vec![], skipped);
    }
    (vec![row], skipped)
}

fn num(s: &str) -> Option<f64> {
    s.trim().trim_matches('\'').parse().ok()
}

/// HF Trainer's formatted values: plain numbers, `0:03:14.38` durations (→ seconds) and
/// `4208495GF` FLOP counts (→ FLOPs).
fn hf_value(s: &str) -> Option<f64> {
    if let Some(gf) = s.strip_suffix("GF") {
        return num(gf).map(|v| v * 1e9);
    }
    if s.contains(':') {
        let parts: Vec<f64> = s.split(':').map(num).collect::<Option<_>>()?;
        return Some(parts.iter().fold(0., |acc, p| acc * 60. + p));
    }
    num(s)
}

fn bench_jsonl(mut row: RunRow, text: &str) -> (Vec<RunRow>, usize) {
    let (mut skipped, mut header, mut summary) = (0, None, None);
    let (mut sweep, mut sweep_runs) = (None, vec![]);
    let (mut latencies, mut n_samples, mut n_tokens) = (vec![], 0usize, 0usize);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Header(h)) => header = Some(h),
            Ok(Record::GenBatch(_)) => {}
            Ok(Record::Batch(b)) => {
                latencies.push(b.latency_ms);
                n_samples += b.n_samples;
                n_tokens += b.n_tokens;
            }
            Ok(Record::Summary(s)) => summary = Some(serde_json::to_value(&s)),
            Ok(Record::TrainSummary(s)) => summary = Some(serde_json::to_value(&s)),
            Ok(Record::Step(s)) if !s.warmup => {
                latencies.push(s.latency_ms);
                n_samples += s.n_samples;
                n_tokens += s.n_tokens;
            }
            Ok(Record::Step(_)) => {}
            Ok(Record::SweepHeader(h)) => sweep = Some(h),
            Ok(Record::SweepRun(r)) => sweep_runs.push(r),
            Ok(Record::SweepRepeats(_)) => {}
            Err(_) => skipped += 1,
        }
    }
    let Some(h) = header else {
        return (sweep_rows(&row, sweep.as_deref(), &sweep_runs), skipped);
    };
    let m = &mut row.meta;
    m.insert("engine".into(), h.engine.clone());
    m.insert("suite".into(), h.suite.clone());
    m.insert("model".into(), h.model.name.clone());
    m.insert("dtype".into(), h.dtype.clone());
    m.insert("device".into(), h.device.clone());
    // The run's GPU: `gpu_index`; logs before it listed only the run's GPU, on CUDA runs.
    let gpu = match h.gpu_index {
        Some(i) => h.host.gpu(i),
        None if h.device.starts_with("cuda") => h.host.gpus.first(),
        None => None,
    }
    .map(|g| g.name.clone())
    .unwrap_or_else(|| format!("CPU ({})", h.host.cpu));
    m.insert("gpu".into(), gpu);
    m.insert("git_commit".into(), h.git_commit.clone());
    m.insert("time_utc".into(), h.time_utc.clone());
    if let Some(attn) = h.engine_info.get("attn") {
        m.insert("attn".into(), attn.clone());
    }
    let x = &mut row.metrics;
    x.insert("batch_size".into(), h.batch_size as f64);
    x.insert("n_parameters".into(), h.model.n_parameters as f64);
    x.insert("load_seconds".into(), h.load_seconds);
    if let Some(n) = h.seq_len {
        x.insert("seq_len".into(), n as f64);
    }
    if let Some(r) = h.repeat {
        x.insert("repeat".into(), r as f64);
    }
    // Tensor-parallel degree: 1 for single-GPU runs, so charts can put tp on an axis.
    x.insert("tp".into(), h.tp.as_ref().map_or(1., |t| t.size as f64));
    // Data-parallel degree and ZeRO stage (1 and 0 without --dp).
    x.insert("dp".into(), h.dp.as_ref().map_or(1., |d| d.size as f64));
    x.insert(
        "zero".into(),
        h.dp.as_ref().map_or(0., |d| d.zero_stage as f64),
    );
    match summary {
        Some(v) => {
            let v = v.expect("summary serializes");
            let status = v["status"].as_str().unwrap_or("ok").to_string();
            row.meta.insert("status".into(), status);
            if let Some(e) = v["error"].as_str() {
                row.meta.insert("error".into(), e.to_string());
            }
            for (k, v) in v.as_object().expect("an object") {
                if let Some(f) = v.as_f64() {
                    row.metrics.insert(k.clone(), f);
                }
                // One level of nesting (`phases_ms_p50.forward`): `phases_ms_p50_forward`.
                for (k2, v2) in v.as_object().into_iter().flatten() {
                    if let Some(f) = v2.as_f64() {
                        row.metrics.insert(format!("{k}_{k2}"), f);
                    }
                }
            }
        }
        // A run killed before its summary: what its finished batches say.
        None => {
            row.meta.insert("status".into(), "partial".into());
            let secs = latencies.iter().sum::<f64>() / 1e3;
            let d = crate::metrics::Distribution::of(&latencies);
            x.insert("n_samples".into(), n_samples as f64);
            x.insert("n_batches".into(), latencies.len() as f64);
            x.insert("n_tokens".into(), n_tokens as f64);
            if secs > 0. {
                x.insert("samples_per_second".into(), n_samples as f64 / secs);
                x.insert("tokens_per_second".into(), n_tokens as f64 / secs);
                x.insert("latency_ms_p50".into(), d.p50);
            }
        }
    }
    (vec![row], skipped)
}

/// A sweep log's rows: one for each run that failed before writing a run log of its own (the
/// others are rows of their run logs, beside it in the sweep directory).
fn sweep_rows(base: &RunRow, header: Option<&SweepHeader>, runs: &[Box<SweepRun>]) -> Vec<RunRow> {
    runs.iter()
        .filter(|r| r.logs.is_empty())
        .map(|r| {
            let mut row = base.clone();
            let c = &r.config;
            let m = &mut row.meta;
            let run = format!(
                "{}_{}_{}_{}_bs{}_r{}",
                m["run"], c.model, c.engine, c.dtype, c.batch_size, r.repeat
            );
            m.insert("run".into(), run);
            m.insert("engine".into(), c.engine.clone());
            m.insert("model".into(), c.model.clone());
            m.insert("dtype".into(), c.dtype.clone());
            m.insert("status".into(), r.status.clone());
            if let Some(e) = &r.error {
                m.insert("error".into(), e.clone());
            }
            if let Some(h) = header {
                m.insert("suite".into(), h.suite.clone());
                m.insert("device".into(), h.device.clone());
                m.insert("git_commit".into(), h.git_commit.clone());
            }
            let x = &mut row.metrics;
            x.insert("batch_size".into(), c.batch_size as f64);
            if let Some(n) = c.seq_len {
                x.insert("seq_len".into(), n as f64);
            }
            x.insert("repeat".into(), r.repeat as f64);
            row
        })
        .collect()
}

fn hf_trainer_log(row: &mut RunRow, text: &str) -> usize {
    let (mut skipped, mut in_block, mut n_logs) = (0, false, 0);
    for line in text.lines() {
        if HF_BLOCK.is_match(line) {
            in_block = true;
        } else if let (true, Some(c)) = (in_block, HF_METRIC.captures(line)) {
            if let Some(v) = hf_value(&c[2]) {
                row.metrics.insert(c[1].to_string(), v);
            }
        } else if HF_DICT.is_match(line.trim_end()) {
            in_block = false;
            let pairs: Vec<_> = HF_PAIR.captures_iter(line).collect();
            // The Trainer's last dict is its train summary; the others are logging steps.
            if pairs.iter().any(|c| &c[1] == "loss") {
                n_logs += 1;
                for c in &pairs {
                    if let Some(v) = num(&c[2]) {
                        row.metrics.insert(format!("{}_last", &c[1]), v);
                    }
                }
            }
        } else {
            in_block = false;
            if !line.trim().is_empty() {
                skipped += 1;
            }
        }
    }
    if n_logs > 0 {
        row.metrics.insert("n_log_steps".into(), n_logs as f64);
    }
    skipped
}

fn json_metrics(row: &mut RunRow, text: &str) -> usize {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) else {
        return 1;
    };
    for (k, v) in map {
        if let Some(f) = v.as_f64() {
            row.metrics.insert(k, f);
        }
    }
    0
}

fn hf_trainer_state(row: &mut RunRow, text: &str) -> usize {
    let Ok(state) = serde_json::from_str::<serde_json::Value>(text) else {
        return 1;
    };
    for k in ["global_step", "epoch"] {
        if let Some(v) = state[k].as_f64() {
            row.metrics.insert(k.into(), v);
        }
    }
    let mut n_logs = 0;
    for entry in state["log_history"].as_array().into_iter().flatten() {
        let Some(obj) = entry.as_object() else {
            continue;
        };
        let is_step = obj.contains_key("loss");
        n_logs += is_step as usize;
        for (k, v) in obj {
            if let Some(f) = v.as_f64() {
                // Step logs keep their last value; summaries (train_*, eval_*) as they are.
                let key = if is_step {
                    format!("{k}_last")
                } else {
                    k.clone()
                };
                row.metrics.insert(key, f);
            }
        }
    }
    row.metrics.insert("n_log_steps".into(), n_logs as f64);
    0
}

fn median(v: &mut [f64]) -> Option<f64> {
    (!v.is_empty()).then(|| {
        v.sort_by(f64::total_cmp);
        crate::metrics::percentile(v, 50.)
    })
}

fn llmc_log(row: &mut RunRow, text: &str) -> usize {
    let (mut skipped, mut ms, mut tps, mut mfu) = (0, vec![], vec![], vec![]);
    let x = &mut row.metrics;
    for line in text.lines().map(str::trim_end) {
        if let Some(c) = LLMC_NEW.captures(line) {
            x.insert("steps".into(), num(&c[1]).unwrap_or(0.));
            x.insert("train_loss_last".into(), num(&c[3]).unwrap_or(f64::NAN));
            x.insert("grad_norm_last".into(), num(&c[4]).unwrap_or(f64::NAN));
            x.insert("learning_rate_last".into(), num(&c[5]).unwrap_or(f64::NAN));
            ms.push(num(&c[6]).unwrap_or(f64::NAN));
            mfu.push(num(&c[7]).unwrap_or(f64::NAN));
            tps.push(num(&c[8]).unwrap_or(f64::NAN));
        } else if let Some(c) = LLMC_OLD_CUDA.captures(line) {
            x.insert("steps".into(), num(&c[1]).unwrap_or(0.));
            x.insert("train_loss_last".into(), num(&c[3]).unwrap_or(f64::NAN));
            ms.push(num(&c[4]).unwrap_or(f64::NAN));
            tps.push(num(&c[5]).unwrap_or(f64::NAN));
        } else if let Some(c) = LLMC_OLD_C.captures(line) {
            x.insert("steps".into(), num(&c[1]).unwrap_or(0.));
            x.insert("train_loss_last".into(), num(&c[2]).unwrap_or(f64::NAN));
            ms.push(num(&c[3]).unwrap_or(f64::NAN));
        } else if let Some(c) = LLMC_VAL.captures(line) {
            x.insert("val_loss_last".into(), num(&c[1]).unwrap_or(f64::NAN));
        } else if let Some(c) = LLMC_AVG.captures(line) {
            x.insert("avg_iteration_ms".into(), num(&c[1]).unwrap_or(f64::NAN));
        } else if !line.trim().is_empty() {
            skipped += 1;
        }
    }
    // llm.c treats the first step as warm-up (cuBLAS/cuDNN initialisation): so do the medians.
    let warm = |v: &mut Vec<f64>| {
        if v.len() > 1 {
            v.remove(0);
        }
    };
    warm(&mut ms);
    warm(&mut tps);
    warm(&mut mfu);
    for (k, v) in [
        ("step_ms_median", &mut ms),
        ("tokens_per_second_median", &mut tps),
        ("mfu_percent_median", &mut mfu),
    ] {
        if let Some(m) = median(v) {
            x.insert(k.into(), m);
        }
    }
    if let Some(t) = tps.last() {
        x.insert("tokens_per_second".into(), *t);
    }
    skipped
}

fn llmc_main_log(row: &mut RunRow, text: &str) -> usize {
    let mut skipped = 0;
    let mut last: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines() {
        match LLMC_MAIN.captures(line.trim_end()) {
            Some(c) => {
                let step = num(&c[1]).unwrap_or(0.);
                last.insert("steps".into(), step.max(*last.get("steps").unwrap_or(&0.)));
                for kv in c[2].split_whitespace() {
                    if let Some((k, v)) = kv.split_once(':') {
                        if let Some(v) = num(v) {
                            last.insert(format!("{k}_last"), v);
                        }
                    }
                }
            }
            None if !line.trim().is_empty() => skipped += 1,
            None => {}
        }
    }
    row.metrics.extend(last);
    skipped
}
