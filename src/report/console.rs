//! Tables printed on stdout: a run's summary, the candle-vs-HF side-by-side of `--engine
//! both` (and whether the engines agree), and a sweep's runs and repeats (for training, every
//! engine's run in one table). Whether two engines agree is decided in [`crate::metrics`]
//! (its tolerances and their reasons); the tables print the verdict.

use crate::log::{read_log, RunOutcome};
use crate::metrics::{first_loss_agreement, identical_generations, score_agreement};
use crate::record::{
    strategy_name, Header, Record, RunStatus, Summary, SweepOutcome, TrainSummary, SWEEP_LOG,
};
use std::path::Path;

/// Bytes as MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024. * 1024.)
}

/// The summary rows of a generation run: generated and decode tokens/s, time to first token,
/// inter-token latency, KV cache.
fn generation_rows(s: &Summary) -> Vec<(&'static str, String)> {
    let f = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
    let mut rows = vec![
        ("generated tokens/s", f(s.generated_tokens_per_second, 1)),
        ("decode tokens/s", f(s.decode_tokens_per_second, 1)),
    ];
    if s.ttft_ms_p50.is_some() {
        rows.push((
            "first token ms",
            format!("p50 {}  p90 {}", f(s.ttft_ms_p50, 3), f(s.ttft_ms_p90, 3)),
        ));
        rows.push((
            "inter-token ms",
            format!(
                "p50 {}  p90 {}  p99 {}",
                f(s.itl_ms_p50, 3),
                f(s.itl_ms_p90, 3),
                f(s.itl_ms_p99, 3)
            ),
        ));
    }
    if let Some(b) = s.kv_cache_bytes {
        rows.push(("KV cache", format!("{:.1} MiB", mib(b))));
    }
    rows
}

/// The summary rows of the GPU trackers, where they measured anything: NVML memory, clocks,
/// energy, model FLOP/s.
fn gpu_rows(s: &Summary) -> Vec<(&'static str, String)> {
    let mut rows = vec![];
    if let Some(nvml) = s.nvml_peak_process_memory_bytes {
        // NVML counts what the driver gave the process; the engine counts its tensors.
        let pool = s.pool_reserved_bytes.unwrap_or(s.peak_memory_bytes);
        rows.push((
            "NVML process peak",
            format!(
                "{:.1} MiB = pool {:.1} MiB reserved ({:.1} used) + {:.1} MiB context, kernels, cuBLAS workspace",
                mib(nvml),
                mib(pool),
                mib(s.peak_memory_bytes),
                (nvml as f64 - pool as f64) / (1024. * 1024.)
            ),
        ));
    }
    if let Some(c) = s.sm_clock_mhz_median {
        rows.push((
            "GPU (median)",
            format!(
                "SM clock {c:.0} MHz, utilisation {:.0} %, mean power {:.0} W",
                s.gpu_utilization_percent_median.unwrap_or(f64::NAN),
                s.power_watts_mean.unwrap_or(f64::NAN)
            ),
        ));
    }
    if let (Some(j), Some(per)) = (s.energy_joules, s.joules_per_sample) {
        rows.push(("energy", format!("{j:.1} J, {per:.4} J/sample")));
    }
    if let Some(a) = s.achieved_tflop_per_second {
        let mfu = match (s.mfu, s.peak_tflop_per_second) {
            (Some(m), Some(p)) => format!(", MFU {:.1}% of {p} TFLOP/s", m * 100.),
            _ => String::new(),
        };
        rows.push(("model FLOP/s", format!("{a:.3} TFLOP/s{mfu}")));
    }
    rows
}

/// `  N outlier(s)` where the timed batches had some ([`crate::metrics::mad_outliers`]).
fn outliers(n: Option<u64>) -> String {
    match n {
        Some(1) => "  1 outlier (> 3.5 MAD)".into(),
        Some(n) if n > 1 => format!("  {n} outliers (> 3.5 MAD)"),
        _ => String::new(),
    }
}

/// ` (95% CI low–high)` with `decimals`, where the summary has an interval.
fn ci95(low: Option<f64>, high: Option<f64>, decimals: usize) -> String {
    match (low, high) {
        (Some(l), Some(h)) => format!(" (95% CI {l:.decimals$}–{h:.decimals$})"),
        _ => String::new(),
    }
}

/// The short table printed on stdout after a scoring or generation run.
pub fn summary_table(h: &Header, s: &Summary, log_path: &Path) -> String {
    let mut t = summary_heading(h, "batch");
    let mut rows = summary_rows(h, s);
    if let Some(g) = &h.generation {
        // No log-likelihoods in a generation run: its own rates instead of a perplexity; the
        // text source has prompts, not passages, and nothing to be right about.
        rows.retain(|(k, _)| *k != "perplexity");
        if g.source == "text" {
            rows.retain(|(k, _)| *k != "accuracy");
            rows[0].0 = "prompts";
        }
        rows.extend(generation_rows(s));
    }
    rows.extend(gpu_rows(s));
    if let Some(n @ 1..) = s.compiles_timed {
        let why = "torch.compile compiled inside the timed batches, which count it: shapes the warm-up did not meet (--pad-multiple 64 buckets them)";
        rows.push(("timed compiles", format!("{n} ({why})")));
    }
    for (k, v) in rows {
        t += &format!("  {k:<18} {v}\n");
    }
    t += &format!("log: {}\n", log_path.display());
    t
}

/// The first line of a run's table (engine, suite, model, precision, device, then `batch` and
/// the batch size: "batch", or "batch ≤" where calls take at most that many), and what `auto`
/// chose and the tensor-parallel ranks where there are.
pub(crate) fn summary_heading(h: &Header, batch: &str) -> String {
    let mut t = format!(
        "{} | {} | {} ({:.2}M params, weights {}) | {} | {} | {batch} {}\n",
        h.engine,
        h.suite,
        h.model.name,
        h.model.n_parameters as f64 / 1e6,
        h.model.weights,
        h.dtype,
        h.device,
        h.batch_size
    );
    if let Some(auto) = &h.auto {
        t += &format!("{auto}\n");
    }
    if let Some(tp) = &h.tp {
        t += &format!(
            "tensor parallel: {} ranks over {} ({}), figures from rank 0\n",
            tp.size,
            tp.backend,
            tp.ranks
                .iter()
                .map(|r| format!("{} {}", r.host, r.info["device"].as_str().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    t
}

/// The rows every scoring or generation summary has: scores, rates, latency, memory, times.
fn summary_rows(h: &Header, s: &Summary) -> Vec<(&'static str, String)> {
    let rows = [
        ("passages", format!("{}", s.n_samples)),
        ("accuracy", format!("{:.4}", s.accuracy)),
        ("perplexity", format!("{:.4}", s.perplexity)),
        (
            "samples/s",
            format!(
                "{:.2}{}",
                s.samples_per_second,
                ci95(
                    s.samples_per_second_ci95_low,
                    s.samples_per_second_ci95_high,
                    2
                )
            ),
        ),
        ("tokens/s", format!("{:.1}", s.tokens_per_second)),
        (
            "batch latency ms",
            format!(
                "p50 {:.3}{}  p90 {:.3}  p99 {:.3}  mean {:.3} ± {:.3}{}",
                s.latency_ms_p50,
                ci95(s.latency_ms_p50_ci95_low, s.latency_ms_p50_ci95_high, 3),
                s.latency_ms_p90,
                s.latency_ms_p99,
                s.latency_ms_mean,
                s.latency_ms_stdev,
                outliers(s.latency_outliers)
            ),
        ),
        ("timed", timed(h, s)),
        (
            "peak memory",
            format!("{:.1} MiB", mib(s.peak_memory_bytes)),
        ),
        (
            "peak host RSS",
            format!("{:.1} MiB", mib(s.peak_host_memory_bytes.unwrap_or(0))),
        ),
        (
            "load / wall",
            format!("{:.2} s / {:.2} s", h.load_seconds, s.wall_seconds),
        ),
    ];
    rows.to_vec()
}

/// `12.41 s, 21 batches (3 passes; --min-time 10 s, --min-batches 10)`: what the timed loop ran
/// and had to reach.
fn timed(h: &Header, s: &Summary) -> String {
    let mut t = format!("{:.2} s, {} batches", s.timed_seconds, s.n_batches);
    if let (Some(p), Some(secs), Some(n)) = (s.passes, h.min_time_s, h.min_batches) {
        let passes = if p == 1 { "pass" } else { "passes" };
        t += &format!(" ({p} {passes}; --min-time {secs} s, --min-batches {n})");
    }
    t
}

/// A candle-vs-HF table: a row a quantity, candle's value, HF's, and the ratio candle/HF.
struct Ratios {
    text: String,
    width: usize,
}

impl Ratios {
    /// The heading, names `width` wide.
    fn new(width: usize) -> Self {
        let text = format!(
            "\n{:<width$} {:>14} {:>14} {:>12}\n",
            "candle vs hf", "candle", "hf", "candle/hf"
        );
        Self { text, width }
    }

    /// One row with `prec` decimals.
    fn row(&mut self, name: &str, a: f64, b: f64, prec: usize) {
        let w = self.width;
        self.text += &format!("{name:<w$} {a:>14.prec$} {b:>14.prec$} {:>12.3}\n", a / b);
    }
}

/// The line under a candle-vs-HF table that names HF's configuration (the ratios are against
/// it) and the padding both engines ran with.
fn hf_configuration(h: &Header) -> String {
    let pad = match h.pad_multiple {
        Some(n) if n > 1 => format!("; batches padded to a multiple of {n}"),
        _ => String::new(),
    };
    format!(
        "hf ran {}{pad}\n",
        crate::record::describe_hf_config(&h.engine_info)
    )
}

/// The candle-vs-HF table of `--engine both`, and whether the two engines agree on the scores
/// ([`crate::metrics::score_agreement`]).
pub fn side_by_side(candle: &RunOutcome<Summary>, hf: &RunOutcome<Summary>) -> (String, bool) {
    let (c, h) = (&candle.summary, &hf.summary);
    let check = score_agreement(&candle.header.dtype, c, h);
    let mut r = Ratios::new(22);
    let mut row = |name: &str, a: f64, b: f64, prec: usize| r.row(name, a, b, prec);
    row("samples/s", c.samples_per_second, h.samples_per_second, 2);
    row("tokens/s", c.tokens_per_second, h.tokens_per_second, 1);
    row("latency p50 ms", c.latency_ms_p50, h.latency_ms_p50, 3);
    row("latency p99 ms", c.latency_ms_p99, h.latency_ms_p99, 3);
    row(
        "peak memory MiB",
        mib(c.peak_memory_bytes),
        mib(h.peak_memory_bytes),
        1,
    );
    row("accuracy", c.accuracy, h.accuracy, 4);
    row("perplexity", c.perplexity, h.perplexity, 4);
    let mut t = r.text;
    t += &hf_configuration(&hf.header);
    t += &format!(
        "scores {} (accuracy {}, perplexity rel. diff {:.2e}, tolerance {:.0e})\n",
        if check.agree { "agree" } else { "DISAGREE" },
        if c.accuracy == h.accuracy {
            "equal".to_string()
        } else {
            format!("differs by {:.4}", check.accuracy_diff)
        },
        check.perplexity_rel,
        check.perplexity_tol
    );
    (t, check.agree)
}

/// The candle-vs-HF table of a generation run, with the agreement of the generated tokens:
/// the share of passages whose generated ids are identical (read back from the two logs;
/// LAMBADA only; informational: [`crate::metrics::identical_generations`]).
pub fn generate_side_by_side(candle: &RunOutcome<Summary>, hf: &RunOutcome<Summary>) -> String {
    let (c, h) = (&candle.summary, &hf.summary);
    let mut r = Ratios::new(24);
    let mut row = |name: &str, a: f64, b: f64, prec: usize| r.row(name, a, b, prec);
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    row("samples/s", c.samples_per_second, h.samples_per_second, 2);
    row(
        "generated tokens/s",
        nan(c.generated_tokens_per_second),
        nan(h.generated_tokens_per_second),
        1,
    );
    row(
        "decode tokens/s",
        nan(c.decode_tokens_per_second),
        nan(h.decode_tokens_per_second),
        1,
    );
    row(
        "time to first token p50",
        nan(c.ttft_ms_p50),
        nan(h.ttft_ms_p50),
        3,
    );
    row(
        "inter-token ms p50",
        nan(c.itl_ms_p50),
        nan(h.itl_ms_p50),
        3,
    );
    row("call latency p50 ms", c.latency_ms_p50, h.latency_ms_p50, 3);
    row(
        "peak memory MiB",
        mib(c.peak_memory_bytes),
        mib(h.peak_memory_bytes),
        1,
    );
    row("accuracy", c.accuracy, h.accuracy, 4);
    let mut t = r.text;
    t += &hf_configuration(&hf.header);
    if let Some((same, n)) = generated_agreement(&candle.log_path, &hf.log_path) {
        t += &format!(
            "generated ids identical for {same} of {n} passages ({:.1}%)\n",
            100. * same as f64 / n.max(1) as f64
        );
    }
    t
}

/// Passages whose generated ids are identical in two generation logs, and how many both have.
fn generated_agreement(a: &Path, b: &Path) -> Option<(usize, usize)> {
    use std::collections::BTreeMap;
    let ids = |p: &Path| -> Option<BTreeMap<usize, Vec<u32>>> {
        let records = read_log(p).ok()?;
        Some(
            records
                .into_iter()
                .filter_map(|r| match r {
                    Record::GenBatch(b) => Some(b.passages),
                    _ => None,
                })
                .flatten()
                .map(|p| (p.index, p.generated))
                .collect(),
        )
    };
    identical_generations(&ids(a)?, &ids(b)?)
}

/// The candle-vs-HF table of `--suite wikitext2 --engine both`, and whether the engines agree.
/// Rates and memory are compared as ratios; the check is the first step's loss with dropout
/// off ([`crate::metrics::first_loss_agreement`]), nothing with dropout on.
pub fn train_side_by_side(
    candle: &RunOutcome<TrainSummary>,
    hf: &RunOutcome<TrainSummary>,
) -> (String, bool) {
    let (c, h) = (&candle.summary, &hf.summary);
    let mut r = Ratios::new(26);
    let mut row = |name: &str, a: f64, b: f64, prec: usize| r.row(name, a, b, prec);
    row(
        "train_samples_per_second",
        c.train_samples_per_second,
        h.train_samples_per_second,
        3,
    );
    row(
        "step latency p50 ms",
        c.step_latency_ms_p50,
        h.step_latency_ms_p50,
        3,
    );
    row("first step loss", c.first_loss, h.first_loss, 6);
    row("train_loss", c.train_loss, h.train_loss, 4);
    row("eval_loss", c.eval_loss, h.eval_loss, 4);
    row("perplexity", c.perplexity, h.perplexity, 3);
    row(
        "peak memory MiB",
        mib(c.peak_memory_bytes),
        mib(h.peak_memory_bytes),
        1,
    );
    let mut t = r.text;
    let dropout = candle.header.train.as_ref().is_none_or(|t| t.dropout);
    if dropout {
        t += "first-step loss not checked: dropout is on (each engine draws its own masks, so losses differ step by step); --no-dropout checks it\n";
        return (t, true);
    }
    let check = first_loss_agreement(&candle.header.dtype, c.first_loss, h.first_loss);
    t += &format!(
        "first-step loss {} (rel. diff {:.2e}, tolerance {:.0e}; dropout off, same weights and batch)\n",
        if check.agree { "agrees" } else { "DISAGREES" },
        check.rel,
        check.tol
    );
    (t, check.agree)
}

/// The printed summary of a training run: what ran, the rates and losses, where the time went,
/// memory.
pub fn train_table(h: &Header, s: &TrainSummary, log_path: &std::path::Path) -> String {
    let mut out = train_heading(h);
    out += &train_rates(s);
    out += &train_timing(s);
    let share = s
        .peak_memory_share
        .map_or(String::new(), |f| format!(" ({:.1}% of the GPU)", f * 100.));
    out += &format!(
        "  peak memory               {:.1} MiB{share}\n",
        s.peak_memory_bytes as f64 / 1048576.
    );
    out += &format!("log: {}\n", log_path.display());
    out
}

/// The first lines of [`train_table`]: engine, model, precision, batch; the device chosen, the
/// data, the data-parallel set-up.
fn train_heading(h: &Header) -> String {
    let t = h.train.as_ref();
    let mut out = format!(
        "{} | {} | {} ({:.2}M params, weights {}) | {} | {} | batch {} x accum {} | block {}\n",
        h.engine_label(),
        h.suite,
        h.model.name,
        h.model.n_parameters as f64 / 1e6,
        h.model.weights,
        h.dtype,
        h.device,
        h.batch_size,
        t.map_or(1, |t| t.grad_accum),
        t.map_or(0, |t| t.block_size),
    );
    if let Some(auto) = &h.auto {
        out += &format!("  device                    {auto}\n");
    }
    if let Some(t) = t {
        out += &format!("  data                      {}\n", t.note);
    }
    if let Some(d) = &h.dp {
        out += &format!(
            "  data parallel             {} ranks over {}, ZeRO-{}{}, global batch {} blocks; figures from rank 0\n",
            d.size,
            d.backend,
            d.zero_stage,
            if d.overlap { ", all-reduce under the backward" } else { "" },
            d.global_batch_size
        );
    }
    out
}

/// The steps, losses and rates of [`train_table`].
fn train_rates(s: &TrainSummary) -> String {
    let warmup_secs = s
        .warmup_runtime
        .map_or(String::new(), |w| format!(": {w:.3} s"));
    let mut out = format!(
        "  steps                     {} ({} warm-up, not timed{warmup_secs})\n",
        s.n_steps, s.warmup_steps
    );
    out += &format!(
        "  train_loss                {:.4} (first {:.4}, last {:.4})\n",
        s.train_loss, s.first_loss, s.last_loss
    );
    out += &format!("  eval_loss                 {:.4}\n", s.eval_loss);
    out += &format!("  perplexity                {:.3}\n", s.perplexity);
    out += &format!(
        "  train_samples_per_second  {:.3}\n",
        s.train_samples_per_second
    );
    out += &format!(
        "  train_steps_per_second    {:.3}\n",
        s.train_steps_per_second
    );
    out += &format!("  tokens/s                  {:.1}\n", s.tokens_per_second);
    if let Some(a) = s.achieved_tflop_per_second {
        let mfu = s
            .mfu
            .map_or(String::new(), |m| format!(", MFU {:.1}%", m * 100.));
        out += &format!("  model FLOP/s              {a:.3} TFLOP/s{mfu}\n");
    }
    out
}

/// Where the time of [`train_table`]'s run went: step latency, all-reduces, each rank's
/// memory, host queueing, phases, runtimes.
fn train_timing(s: &TrainSummary) -> String {
    let mut out = format!(
        "  step latency ms           p50 {:.3}  p90 {:.3}\n",
        s.step_latency_ms_p50, s.step_latency_ms_p90
    );
    if let Some(c) = s.comm_share {
        out += &format!(
            "  all-reduce share          {:.1}% of the timed steps\n",
            c * 100.
        );
    }
    if let Some(m) = &s.per_rank_peak_memory_bytes {
        let gib: Vec<String> = m
            .iter()
            .map(|b| format!("{:.2}", *b as f64 / (1u64 << 30) as f64))
            .collect();
        out += &format!("  peak memory by rank       {} GiB\n", gib.join(" / "));
    }
    if let Some(h) = s.host_ms_p50 {
        // Queueing near the step's latency: the GPU waits for the host.
        let bound = match h >= 0.9 * s.step_latency_ms_p50 {
            true => "host-bound: the GPU waits for the host",
            false => "under the step's latency: the GPU is the bound",
        };
        out += &format!("  host queueing ms p50      {h:.3} ({bound})\n");
    }
    if let Some(p) = &s.phases_ms_p50 {
        out += &format!(
            "  phases p50 ms             forward {:.3}  backward {:.3}  update {:.3}\n",
            p.forward, p.backward, p.update
        );
    }
    out += &format!(
        "  train_runtime / eval_runtime  {:.3} s / {:.3} s\n",
        s.train_runtime, s.eval_runtime
    );
    if let Some(e) = s.epoch_seconds {
        out += &format!("  time per epoch            {e:.3} s (at the timed steps' rate)\n");
    }
    out
}

/// `v` times `scale` with `p` decimals, `-` for none.
fn opt(v: Option<f64>, scale: f64, p: usize) -> String {
    v.map_or("-".into(), |v| format!("{:.p$}", v * scale))
}

/// The finished training runs of a sweep, in run order: (header, summary).
fn train_runs(out: &SweepOutcome) -> Vec<(Header, TrainSummary)> {
    let mut runs = vec![];
    for log in out.runs.iter().flat_map(|r| r.logs.iter()) {
        let Ok(records) = read_log(&out.dir.join(log)) else {
            continue;
        };
        let header = records.iter().find_map(|r| match r {
            Record::Header(h) => Some((**h).clone()),
            _ => None,
        });
        let summary = records.iter().find_map(|r| match r {
            Record::TrainSummary(s) => Some((**s).clone()),
            _ => None,
        });
        if let (Some(h), Some(s)) = (header, summary) {
            runs.push((h, s));
        }
    }
    runs
}

/// A row of the training sweep table: its name and each run's cell.
type TrainRow = (&'static str, fn(&TrainSummary) -> String);

/// The rows of [`train_sweep_table`].
const TRAIN_ROWS: [TrainRow; 11] = [
    ("train_samples_per_second", |s| {
        format!("{:.2}", s.train_samples_per_second)
    }),
    ("tokens/s", |s| format!("{:.0}", s.tokens_per_second)),
    ("step latency p50 ms", |s| {
        format!("{:.3}", s.step_latency_ms_p50)
    }),
    ("MFU %", |s| opt(s.mfu, 100., 1)),
    ("time per epoch s", |s| opt(s.epoch_seconds, 1., 2)),
    ("peak memory MiB", |s| {
        format!("{:.0}", mib(s.peak_memory_bytes))
    }),
    ("peak memory % GPU", |s| opt(s.peak_memory_share, 100., 1)),
    ("warm-up s (not timed)", |s| opt(s.warmup_runtime, 1., 2)),
    ("train_loss", |s| format!("{:.4}", s.train_loss)),
    ("eval_loss", |s| format!("{:.4}", s.eval_loss)),
    ("status", |s| s.status.to_string()),
];

/// Each run's column name: its engine (`hf-compile` for compiled HF) when the runs share
/// model, precision and batch size, else all four.
fn run_labels(runs: &[(Header, TrainSummary)]) -> Vec<String> {
    let key = |h: &Header| (h.model.name.clone(), h.dtype.clone(), h.batch_size);
    let one_config = runs.iter().all(|(h, _)| key(h) == key(&runs[0].0));
    // `--strategies`: each run's strategy and recompute setting name it too.
    let strategy = |h: &Header| {
        let recompute = match h.engine_info.get("recompute").map(String::as_str) {
            Some("blocks") => "+rc",
            Some("mlp") => "+rc-mlp",
            _ => "",
        };
        match &h.dp {
            Some(d) => format!(" {}{recompute}", strategy_name(d.zero_stage)),
            None => recompute.replace('+', " "),
        }
    };
    runs.iter()
        .map(|(h, _)| match one_config {
            true => format!("{}{}", h.engine_label(), strategy(h)),
            false => format!(
                "{} {} bs{} {}{}",
                h.model.name,
                h.dtype,
                h.batch_size,
                h.engine_label(),
                strategy(h)
            ),
        })
        .collect()
}

/// A training sweep's runs side by side, one column a run: `--engine candle,hf,llmc` as one
/// table. The last row is each run's train samples/s over the first column's. Empty when the
/// sweep trained nothing.
pub fn train_sweep_table(out: &SweepOutcome) -> String {
    let runs = train_runs(out);
    let labels = run_labels(&runs);
    let (Some((_, first)), Some(first_label)) = (runs.first(), labels.first()) else {
        return String::new();
    };
    let w = labels.iter().map(String::len).max().unwrap_or(0).max(10);
    let line = |name: &str, cells: Vec<String>| {
        let cells: String = cells.iter().map(|c| format!(" {c:>w$}")).collect();
        format!("{name:<26}{cells}\n")
    };
    let mut t = String::from("\n") + &line("training", labels.clone());
    for (name, cell) in TRAIN_ROWS {
        t += &line(name, runs.iter().map(|(_, s)| cell(s)).collect());
    }
    let ratio = |s: &TrainSummary| s.train_samples_per_second / first.train_samples_per_second;
    let ratios = runs
        .iter()
        .map(|(_, s)| format!("{:.3}", ratio(s)))
        .collect();
    t + &line(&format!("samples/s / {first_label}"), ratios)
}

/// The table printed after a sweep: one line a run, then the repeats folded.
pub fn sweep_table(out: &SweepOutcome) -> String {
    let mut t = String::new();
    let counts: Vec<String> = RunStatus::ALL
        .iter()
        .map(|s| format!("{} {s}", out.count(s)))
        .collect();
    t += &format!(
        "sweep: {} runs ({}){}\n",
        out.runs.len(),
        counts.join(", "),
        if out.skipped > 0 {
            format!(", {} done earlier and skipped (--resume)", out.skipped)
        } else {
            String::new()
        }
    );
    for r in &out.runs {
        t += &format!("  {}\n", r.line());
    }
    if !out.repeats.is_empty() {
        t += &format!(
            "  {:<64} {:>5} {:>12} {:>12} {:>12} {:>7} {:>10}\n",
            "repeats", "ok", "samples/s", "min", "max", "cv %", "p50 ms"
        );
        for r in &out.repeats {
            let (med, min, max, cv) = r
                .samples_per_second
                .as_ref()
                .map_or((f64::NAN, f64::NAN, f64::NAN, f64::NAN), |s| {
                    (s.median, s.min, s.max, 100. * s.cv)
                });
            let p50 = r.latency_ms_p50.as_ref().map_or(f64::NAN, |s| s.median);
            t += &format!(
                "  {:<64} {:>5} {med:>12.2} {min:>12.2} {max:>12.2} {cv:>7.2} {p50:>10.3}\n",
                r.config.key(),
                format!("{}/{}", r.n_ok, r.n_repeats),
            );
        }
    }
    t += &format!("sweep log: {}\n", out.dir.join(SWEEP_LOG).display());
    t
}
