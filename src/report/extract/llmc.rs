//! llm.c's logs: its stdout (`step …` lines of the C trainer, the older CUDA trainer with
//! right-aligned step numbers, and the current CUDA trainer; `val loss`, `HellaSwag`, `total
//! average iteration time`) and its `main.log` (`s:N trl:… lr:… norm:…`, `s:N tel:…`,
//! `s:N eval:…`). Both land in the columns of [`super::schema`]; the step statistics use
//! [`crate::metrics`], as the bench's own summaries do.

use super::formats::{float, num};
use super::schema::{canonical, last};
use super::RunRow;
use crate::metrics::Distribution;
use regex::Regex;
use std::sync::LazyLock;

const NUM: &str = r"[-\d.eE+naif]+";

static STEP_CUDA: LazyLock<Regex> = LazyLock::new(|| {
    // step    1/74 | loss 11.0 (+0.00z)| norm 15.4 (+0.00z)| lr 6.00e-06 | 1234.56 ms | 12.3% bf16 MFU | 12345 tok/s
    // (2024: "| train loss 11.0 | norm 15.4 | …", without the z-scores; some builds print no MFU)
    Regex::new(&format!(r"^step\s+(\d+)/(\d+)\s*\|\s*(?:train )?loss ({NUM})(?:\s*\([^)]*\))?\s*\|\s*norm ({NUM})(?:\s*\([^)]*\))?\s*\|\s*lr ({NUM})\s*\|\s*([\d.]+) ms(?:\s*\|\s*(-?[\d.]+)% bf16 MFU)?\s*\|\s*([\d.]+) tok/s")).unwrap()
});
static STEP_OLD_CUDA: LazyLock<Regex> = LazyLock::new(|| {
    // step   61/74: train loss 3.213066 (312.014672 ms, 13127 tok/s)   ("step %4d/%d: …")
    Regex::new(&format!(
        r"^step\s+(\d+)/(\d+): train loss ({NUM}) \(([\d.]+) ms, ([\d.]+) tok/s\)"
    ))
    .unwrap()
});
static STEP_C: LazyLock<Regex> = LazyLock::new(|| {
    // step 20: train loss 4.52 (took 2636.6 ms)   (0-based step)
    Regex::new(&format!(
        r"^step\s+(\d+): train loss ({NUM}) \(took ([\d.]+) ms\)"
    ))
    .unwrap()
});
static VAL: LazyLock<Regex> = LazyLock::new(|| Regex::new(&format!(r"^val loss ({NUM})")).unwrap());
static HELLASWAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^HellaSwag: \d+/\d+ = ([\d.]+)").unwrap());
static AVG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^total average iteration time: ([\d.]+) ms").unwrap());
static MAIN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"^s:(\d+)((?: \w+:{NUM})+)\s*$")).unwrap());

pub(super) fn is_step_line(line: &str) -> bool {
    STEP_CUDA.is_match(line) || STEP_OLD_CUDA.is_match(line) || STEP_C.is_match(line)
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
    if let Some(c) = STEP_CUDA.captures(line) {
        steps.n = c[1].parse().unwrap_or(0);
        steps.loss.push(f(&c[3]));
        row.set("grad_norm_last", f(&c[4]));
        row.set("learning_rate_last", f(&c[5]));
        steps.ms.push(f(&c[6]));
        if let Some(m) = c.get(7) {
            steps.mfu.push(f(m.as_str()));
        }
        steps.tok_per_s.push(f(&c[8]));
    } else if let Some(c) = STEP_OLD_CUDA.captures(line) {
        steps.n = c[1].parse().unwrap_or(0);
        steps.loss.push(f(&c[3]));
        steps.ms.push(f(&c[4]));
        steps.tok_per_s.push(f(&c[5]));
    } else if let Some(c) = STEP_C.captures(line) {
        // The C trainer counts from 0.
        steps.n = c[1].parse::<i64>().map_or(0, |s| s + 1);
        steps.loss.push(f(&c[2]));
        steps.ms.push(f(&c[3]));
    } else if let Some(c) = VAL.captures(line) {
        row.set("eval_loss", f(&c[1]));
    } else if let Some(c) = HELLASWAG.captures(line) {
        row.set("hellaswag_accuracy", f(&c[1]));
    } else if let Some(c) = AVG.captures(line) {
        steps.avg_ms = Some(f(&c[1]));
    } else {
        return false;
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
                    steps.n = steps.n.max(step + 1);
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
