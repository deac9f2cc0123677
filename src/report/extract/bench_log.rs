//! transformer-bench's own logs -> rows: a run log gives one row (its header's settings, its
//! summary's metrics, or, for a run killed before its summary, what its finished batches or
//! steps say); a sweep log gives a row for each run that died before writing a log.

use super::schema::canonical;
use crate::metrics::{per_second, Distribution};
use crate::record::{Header, Record, RunStatus, ServingInfo, StepRecord, SweepHeader, SweepRun};
use crate::report::row::{Num, RunRow};

/// The records of one log, read once.
#[derive(Default)]
struct Collected {
    header: Option<Box<Header>>,
    summary: Option<serde_json::Value>,
    sweep: Option<Box<SweepHeader>>,
    sweep_runs: Vec<SweepRun>,
    /// Timed batches (LAMBADA) or timed steps (training): latency, samples, tokens.
    latencies_ms: Vec<f64>,
    n_samples: usize,
    n_tokens: usize,
    /// Scoring and generation: samples of the first pass, and the passes begun (`--min-time`).
    first_pass_samples: usize,
    passes: usize,
    /// Training: every step's loss (warm-up included), and the last step.
    losses: Vec<f64>,
    last_step: Option<StepRecord>,
    skipped: usize,
}

impl Collected {
    /// Counts a timed batch of `n` samples in pass `pass`.
    fn pass(&mut self, pass: usize, n: usize) {
        self.passes = self.passes.max(pass + 1);
        if pass == 0 {
            self.first_pass_samples += n;
        }
    }
}

fn collect(text: &str) -> Collected {
    let mut c = Collected::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Header(h)) => c.header = Some(h),
            Ok(Record::Batch(b)) => {
                c.latencies_ms.push(b.latency_ms);
                c.n_samples += b.n_samples;
                c.n_tokens += b.n_tokens;
                c.pass(b.pass, b.n_samples);
            }
            Ok(Record::Summary(s)) => c.summary = serde_json::to_value(&s).ok(),
            Ok(Record::TrainSummary(s)) => c.summary = serde_json::to_value(&s).ok(),
            Ok(Record::ServingSummary(s)) => c.summary = serde_json::to_value(&s).ok(),
            // A serving run killed before its summary has none: its row says `partial`.
            Ok(Record::Request(_)) => {}
            Ok(Record::Step(s)) => {
                c.losses.push(s.loss);
                if !s.warmup {
                    c.latencies_ms.push(s.latency_ms);
                    c.n_samples += s.n_samples;
                    c.n_tokens += s.n_tokens;
                }
                c.last_step = Some(s);
            }
            Ok(Record::SweepHeader(h)) => c.sweep = Some(h),
            Ok(Record::SweepRun(r)) => c.sweep_runs.push(*r),
            Ok(Record::SweepRepeats(_)) => {}
            Ok(Record::GenBatch(b)) => {
                c.latencies_ms.push(b.latency_ms);
                c.n_samples += b.n_samples;
                c.n_tokens += b.n_samples * b.new_tokens;
                c.pass(b.pass, b.n_samples);
            }
            Err(_) => c.skipped += 1,
        }
    }
    c
}

/// A bench log's rows and the number of lines that were not records.
pub(super) fn parse(mut row: RunRow, text: &str) -> (Vec<RunRow>, usize) {
    let c = collect(text);
    let Some(h) = &c.header else {
        return (
            sweep_rows(&row, c.sweep.as_deref(), &c.sweep_runs),
            c.skipped,
        );
    };
    header_columns(&mut row, h);
    if let Some(s) = &c.last_step {
        row.set("learning_rate_last", s.learning_rate);
        row.set("grad_norm_last", s.grad_norm);
    }
    match &c.summary {
        Some(v) => summary_columns(&mut row, v),
        None if h.train.is_some() => partial_train_columns(&mut row, &c),
        None => partial_columns(&mut row, &c),
    }
    (vec![row], c.skipped)
}

/// What the header says: the run's settings.
fn header_columns(row: &mut RunRow, h: &Header) {
    let m = &mut row.meta;
    // `hf-compile` for HF with torch.compile: its own series and its own side of a ratio.
    m.insert("engine".into(), h.engine_label());
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
    if let Some(d) = &h.host.driver_version {
        m.insert("driver".into(), d.clone());
    }
    m.insert("git_commit".into(), h.git_commit.clone());
    m.insert("time_utc".into(), h.time_utc.clone());
    engine_columns(row, h);
    row.set("batch_size", h.batch_size);
    row.set("n_parameters", h.model.n_parameters);
    row.set("load_seconds", h.load_seconds);
    if let Some(n) = h.seq_len {
        row.set("seq_len", n);
    }
    if let Some(r) = h.repeat {
        row.set("repeat", r);
    }
    // What the timed loop had to reach (the summary says how many passes it ran).
    if let Some(s) = h.min_time_s {
        row.set("min_time_s", s);
    }
    if let Some(n) = h.min_batches {
        row.set("min_batches", n);
    }
    // Tensor-parallel degree: 1 for single-GPU runs, so charts can put tp on an axis.
    row.set("tp", h.tp.as_ref().map_or(1, |t| t.size));
    // Data-parallel degree and ZeRO stage (1 and 0 without --dp).
    row.set("dp", h.dp.as_ref().map_or(1, |d| d.size));
    row.set("zero", h.dp.as_ref().map_or(0, |d| d.zero_stage as usize));
    // Training runs' strategy (`--strategies`): one process is `single`.
    match (&h.dp, &h.train) {
        (Some(d), _) => {
            m_insert(row, "strategy", &crate::record::strategy_name(d.zero_stage));
            m_insert(row, "dp_overlap", if d.overlap { "on" } else { "off" });
        }
        (None, Some(_)) => m_insert(row, "strategy", "single"),
        _ => {}
    }
    // Training runs' dropout and gradient accumulation: a dp run's one-GPU baseline shares them.
    if let Some(t) = &h.train {
        m_insert(row, "dropout", if t.dropout { "on" } else { "off" });
        row.set("grad_accum", t.grad_accum);
    }
    if let Some(s) = &h.serving {
        serving_columns(row, s);
    }
    // Generation runs: what was generated from (lambada / text); the summary holds the rates.
    if let Some(g) = &h.generation {
        m_insert(row, "mode", "generate");
        m_insert(row, "gen_source", &g.source);
        if let Some(n) = g.new_tokens {
            row.set("new_tokens", n);
        }
        if let Some(n) = g.prompt_len {
            row.set("prompt_len", n);
        }
    }
}

/// The engine's configuration: HF's attention (and what asked for it: `best` with the probe's
/// time of each candidate) and torch.compile; candle's fused paths and backward; the padding
/// multiple (both engines).
fn engine_columns(row: &mut RunRow, h: &Header) {
    let info = &h.engine_info;
    for (key, column) in [
        ("attn", "attn"),
        ("attn_requested", "attn_requested"),
        // HF's torch.compile (--hf-compile; a static KV cache for generation): a configuration
        // of its own, never averaged with the eager runs.
        ("compile", "hf_compile"),
    ] {
        if let Some(v) = info.get(key) {
            m_insert(row, column, v);
        }
    }
    // candle's configuration: its fused paths, how a training step gets its gradients, and
    // how scoring lays out a batch (packed: its passages end to end, no padding).
    for key in ["fused", "backward", "recompute", "scoring"] {
        if let Some(v) = info.get(key) {
            m_insert(row, key, v);
        }
    }
    for (k, v) in info.iter().filter(|(k, _)| k.starts_with("attn_probe_ms_")) {
        if let Ok(ms) = v.parse::<f64>() {
            row.set(k, ms);
        }
    }
    if let Some(n) = h.pad_multiple {
        row.set("pad_multiple", n);
    }
}

/// A serving run's load (the summary holds its rates and latencies): `request_rate` only where
/// finite (an infinite rate is `inf` in the `arrivals` column), the lengths' ranges.
fn serving_columns(row: &mut RunRow, s: &ServingInfo) {
    m_insert(row, "batching", &s.batching);
    // The description's first word (`continuous` / `static`): a short column for tables and legends.
    let mode = s.batching.split(':').next().unwrap_or_default().trim();
    m_insert(row, "batching_mode", mode);
    let arrivals = match (s.request_rate, s.max_concurrency) {
        (None, Some(_)) => "closed",
        (None, None) => "inf",
        (Some(_), _) if s.burstiness == 1. => "poisson",
        (Some(_), _) => "gamma",
    };
    m_insert(row, "arrivals", arrivals);
    if let Some(r) = s.request_rate {
        row.set("request_rate", r);
    }
    row.set("burstiness", s.burstiness);
    if let Some(c) = s.max_concurrency {
        row.set("max_concurrency", c);
    }
    row.set("num_requests", s.num_requests);
    row.set("input_len_min", s.input_len.0);
    row.set("input_len_max", s.input_len.1);
    row.set("output_len_min", s.output_len.0);
    row.set("output_len_max", s.output_len.1);
    row.set("load_seed", s.seed);
    if let Some(x) = s.slo_ttft_ms {
        row.set("slo_ttft_ms", x);
    }
    if let Some(y) = s.slo_tpot_ms {
        row.set("slo_tpot_ms", y);
    }
}

fn m_insert(row: &mut RunRow, k: &str, v: &str) {
    row.meta.insert(k.into(), v.into());
}

/// The summary record's fields, one level of nesting flattened
/// (`phases_ms_p50.forward` -> `phases_ms_p50_forward`).
fn summary_columns(row: &mut RunRow, v: &serde_json::Value) {
    let status = v["status"].as_str().unwrap_or(RunStatus::Ok.as_str());
    row.meta.insert("status".into(), status.into());
    if let Some(e) = v["error"].as_str() {
        row.meta.insert("error".into(), e.to_string());
    }
    for (k, v) in v.as_object().into_iter().flatten() {
        if let Some(n) = Num::from_json(v) {
            row.set(canonical(k), n);
        }
        for (k2, v2) in v.as_object().into_iter().flatten() {
            if let Some(n) = Num::from_json(v2) {
                row.set(format!("{k}_{k2}"), n);
            }
        }
    }
}

/// A LAMBADA or generation run killed before its summary: what its finished batches (calls)
/// say, as its summary would (`n_samples` of the first pass, rates over every pass); for
/// generation, tokens are the generated ones.
fn partial_columns(row: &mut RunRow, c: &Collected) {
    row.meta.insert("status".into(), "partial".into());
    let secs = c.latencies_ms.iter().sum::<f64>() / 1e3;
    row.set("n_samples", c.first_pass_samples);
    row.set("timed_samples", c.n_samples);
    row.set("passes", c.passes);
    row.set("n_batches", c.latencies_ms.len());
    row.set("n_tokens", c.n_tokens);
    if secs > 0. {
        row.set("samples_per_second", per_second(c.n_samples as f64, secs));
        row.set("tokens_per_second", per_second(c.n_tokens as f64, secs));
        row.set("latency_ms_p50", Distribution::of(&c.latencies_ms).p50);
    }
}

/// A training run killed before its summary: its finished steps, under the names of the
/// training summary.
fn partial_train_columns(row: &mut RunRow, c: &Collected) {
    row.meta.insert("status".into(), "partial".into());
    row.set("n_steps", c.losses.len());
    if let (Some(first), Some(last)) = (c.losses.first(), c.losses.last()) {
        row.set("train_loss", Distribution::of(&c.losses).mean);
        row.set("train_loss_first", *first);
        row.set("train_loss_last", *last);
    }
    let secs = c.latencies_ms.iter().sum::<f64>() / 1e3;
    if secs > 0. {
        let d = Distribution::of(&c.latencies_ms);
        row.set("train_runtime", secs);
        row.set(
            "train_samples_per_second",
            per_second(c.n_samples as f64, secs),
        );
        let steps = c.latencies_ms.len() as f64;
        row.set("train_steps_per_second", per_second(steps, secs));
        row.set("tokens_per_second", per_second(c.n_tokens as f64, secs));
        row.set("step_latency_ms_p50", d.p50);
        row.set("step_latency_ms_p90", d.p90);
        row.set("step_latency_ms_mean", d.mean);
    }
}

/// A sweep log's rows: one for each run that failed before writing a run log of its own (the
/// others are rows of their run logs, beside it in the sweep directory).
fn sweep_rows(base: &RunRow, header: Option<&SweepHeader>, runs: &[SweepRun]) -> Vec<RunRow> {
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
            m.insert("status".into(), r.status.to_string());
            if let Some(e) = &r.error {
                m.insert("error".into(), e.clone());
            }
            if let Some(h) = header {
                m.insert("suite".into(), h.suite.clone());
                m.insert("device".into(), h.device.clone());
                m.insert("git_commit".into(), h.git_commit.clone());
            }
            // `--strategies` / `--recompute` axes: the configuration's strategy and recompute, as
            // a run log names them (a run that wrote no log still has them).
            if c.zero.is_some() || c.recompute.is_some() {
                let recompute = c.recompute.unwrap_or_default().as_str();
                m.insert("recompute".into(), recompute.into());
                let zero = c.zero.map(|z| {
                    m.insert("strategy".into(), crate::record::strategy_name(z));
                    format!("_zero{z}")
                });
                m.entry("run".into()).and_modify(|run| {
                    run.push_str(&format!("{}_{recompute}", zero.unwrap_or_default()));
                });
            }
            // A serving sweep's rate: its column as a run log's header gives it (none for inf).
            if let Some(rate) = &c.request_rate {
                m.entry("run".into())
                    .and_modify(|run| run.push_str(&format!("_rate{rate}")));
            }
            if let Some(z) = c.zero {
                row.set("zero", z as usize);
            }
            let rate = c
                .request_rate
                .as_deref()
                .and_then(|r| r.parse::<f64>().ok());
            if let Some(r) = rate.filter(|r| r.is_finite()) {
                row.set("request_rate", r);
            }
            row.set("batch_size", c.batch_size);
            if let Some(n) = c.seq_len {
                row.set("seq_len", n);
            }
            row.set("repeat", r.repeat);
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::SweepConfig;
    use crate::train::Recompute;

    /// A `--strategies` or `--recompute` configuration that never ran (out of memory at a
    /// smaller batch) keeps its strategy and recompute in its row, and a run name of its own.
    #[test]
    fn a_strategy_run_without_a_log_keeps_its_strategy() {
        let base = RunRow {
            meta: [("run".to_string(), "sweep".to_string())].into(),
            metrics: Default::default(),
        };
        let config = |zero, recompute| SweepConfig {
            model: "gpt2-xl".into(),
            dtype: "bf16".into(),
            batch_size: 16,
            seq_len: None,
            engine: "candle".into(),
            new_tokens: None,
            zero,
            recompute,
            request_rate: None,
        };
        let run = |c: SweepConfig| SweepRun {
            config: c,
            repeat: 0,
            status: crate::record::RunStatus::Oom,
            error: Some("not run: batch 8 of this configuration ran out of memory".into()),
            exit_code: None,
            wall_seconds: 0.,
            logs: vec![],
            samples_per_second: None,
            latency_ms_p50: None,
        };
        let rows = sweep_rows(
            &base,
            None,
            &[
                run(config(Some(0), None)),
                run(config(Some(3), Some(Recompute::Blocks))),
                run(config(Some(3), Some(Recompute::Mlp))),
                run(config(None, Some(Recompute::Mlp))),
                run(config(None, None)),
            ],
        );
        let meta = |i: usize, k: &str| rows[i].meta[k].clone();
        assert_eq!(
            (meta(0, "strategy"), meta(0, "recompute")),
            ("dp".into(), "off".into())
        );
        assert_eq!(
            (meta(1, "strategy"), meta(1, "recompute")),
            ("zero3".into(), "blocks".into())
        );
        assert_eq!(meta(2, "recompute"), "mlp");
        // A recompute axis alone: its kind, no strategy.
        assert_eq!(meta(3, "recompute"), "mlp");
        assert!(!rows[3].meta.contains_key("strategy"));
        assert!(!rows[4].meta.contains_key("recompute"));
        let runs: Vec<String> = (0..4).map(|i| meta(i, "run")).collect();
        for (i, r) in runs.iter().enumerate() {
            assert!(!runs[..i].contains(r), "{runs:?}");
        }
        assert_eq!(meta(1, "status"), "oom");
    }
}
