//! llm.c's logs: its stdout (`step …` lines of the C trainer, the older CUDA trainer with
//! right-aligned step numbers, and the current CUDA trainer; `val loss`, `HellaSwag`, `total
//! average iteration time`: read by [`crate::llmc_output`], the parser the llmc engine runs on
//! the live trainer) and its `main.log` (`s:N trl:… lr:… norm:…`, `s:N tel:…`,
//! `s:N eval:…`). Both land in the columns of [`super::schema`]; the step statistics use
//! [`crate::metrics`], as the bench's own summaries do.

use super::number::{float, num};
use super::schema::{canonical, last};
use crate::llmc_output::{parse_line, Line};
use crate::metrics::Distribution;
use crate::report::row::RunRow;
use regex::Regex;
use std::sync::LazyLock;

static MAIN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^s:(\d+)((?: \w+:[-\d.eE+naif]+)+)\s*$").unwrap());

pub(super) fn is_step_line(line: &str) -> bool {
    matches!(parse_line(line), Some(Line::Step(_)))
}

pub(super) fn is_main_log_line(line: &str) -> bool {
    MAIN.is_match(line)
}

/// What the step lines of a run say, before it becomes columns.
#[derive(Default)]
struct Steps {
    /// Optimizer steps done.
    n: i64,
    loss: Vec<f64>,
    ms: Vec<f64>,
    tok_per_s: Vec<f64>,
    /// llm.c's MFU, percent.
    mfu: Vec<f64>,
    /// llm.c's `total average iteration time`: over every timed step (all but the first),
    /// even where stdout is cut short; it wins over the mean of the printed steps.
    avg_ms: Option<f64>,
}

impl Steps {
    /// Columns of the steps: the step statistics skip the first step, which llm.c times as
    /// warm-up (cuBLAS/cuDNN initialisation) and leaves out of its own average.
    fn finish(mut self, row: &mut RunRow) {
        if self.n > 0 {
            row.set("n_steps", self.n as usize);
        }
        if let Some(l) = self.loss.last() {
            row.set("train_loss_last", *l);
            // Mean of every step's loss, warm-up included: the bench's and HF's `train_loss`.
            row.set("train_loss", Distribution::of(&self.loss).mean);
        }
        for v in [&mut self.ms, &mut self.tok_per_s, &mut self.mfu] {
            if v.len() > 1 {
                v.remove(0);
            }
        }
        if !self.ms.is_empty() {
            let d = Distribution::of(&self.ms);
            row.set("step_latency_ms_p50", d.p50);
            row.set("step_latency_ms_p90", d.p90);
            row.set("step_latency_ms_mean", self.avg_ms.unwrap_or(d.mean));
        } else if let Some(a) = self.avg_ms {
            row.set("step_latency_ms_mean", a);
        }
        // An MFU below 0 is llm.c's "unknown GPU".
        self.mfu.retain(|m| *m >= 0.);
        if !self.mfu.is_empty() {
            row.set("mfu", Distribution::of(&self.mfu).p50 / 100.);
        }
        // llm.c's own rate: the current trainer prints a running (EMA) figure, so the last.
        if let Some(t) = self.tok_per_s.last() {
            row.set("tokens_per_second", *t);
        }
    }
}

fn f(s: &str) -> f64 {
    float(s).unwrap_or(f64::NAN)
}

/// One stdout line into `steps` / `row`; false when no pattern knows it.
fn stdout_line(line: &str, steps: &mut Steps, row: &mut RunRow) -> bool {
    match parse_line(line) {
        Some(Line::Step(s)) => {
            steps.n = s.step as i64;
            steps.loss.push(s.loss);
            if let Some(g) = s.grad_norm {
                row.set("grad_norm_last", g);
            }
            if let Some(lr) = s.lr {
                row.set("learning_rate_last", lr);
            }
            steps.ms.push(s.ms);
            steps.mfu.extend(s.mfu_percent);
            steps.tok_per_s.extend(s.tok_per_s);
        }
        Some(Line::ValLoss(v)) => row.set("eval_loss", v),
        Some(Line::HellaSwag(v)) => row.set("hellaswag_accuracy", v),
        Some(Line::AverageMs(v)) => steps.avg_ms = Some(v),
        // Not a column of llm.c's own logs (the llmc engine reads it into its run log).
        Some(Line::DeviceMemory { .. }) => {}
        None => return false,
    }
    true
}

pub(super) fn stdout_log(row: &mut RunRow, text: &str) -> usize {
    let (mut skipped, mut steps) = (0, Steps::default());
    for line in text.lines().map(str::trim_end) {
        if !stdout_line(line, &mut steps, row) && !line.trim().is_empty() {
            skipped += 1;
        }
    }
    steps.finish(row);
    skipped
}

pub(super) fn main_log(row: &mut RunRow, text: &str) -> usize {
    let (mut skipped, mut steps) = (0, Steps::default());
    for line in text.lines() {
        let Some(c) = MAIN.captures(line.trim_end()) else {
            skipped += !line.trim().is_empty() as usize;
            continue;
        };
        let step: i64 = c[1].parse().unwrap_or(0);
        for (k, v) in c[2].split_whitespace().filter_map(|kv| kv.split_once(':')) {
            match canonical(k) {
                // `s:N trl:` is the loss of step N (0-based): N + 1 steps done.
                "train_loss" => {
                    steps.loss.push(f(v));
                    // Saturating: `s:9223372036854775807` overflowed here (#38 fuzzing).
                    steps.n = steps.n.max(step.saturating_add(1));
                }
                // `s:N tel:` / `eval:` come before step N runs: N steps done.
                q @ ("eval_loss" | "hellaswag_accuracy") => {
                    row.set(q, f(v));
                    steps.n = steps.n.max(step);
                }
                _ => {
                    if let Some(n) = num(v) {
                        row.set(last(k), n);
                    }
                }
            }
        }
    }
    steps.finish(row);
    skipped
}
