//! `--table dp-report`: data-parallel training runs, per directory (one host and session):
//!
//! - equivalence: each dp N run against the dp 1 run of the same model and dtype whose global
//!   batch (batch × grad_accum × N) is the same, both without dropout: the largest relative
//!   difference of the per-step loss and gradient norm;
//! - scaling: every run's train samples/s and scaling efficiency = throughput(N) / (N ×
//!   throughput(1)) against the dp 1 run of the same model, dtype, per-rank batch (batch ×
//!   grad_accum) and dropout, with the all-reduce share and peak memory per rank.

use super::logs::{by_dir, rel_diff, Run};
use super::{md_rows, sci};
use crate::error::Result;
use crate::record::TrainSummary;

/// What the two tables need of a training run.
struct DpRun<'a> {
    run: &'a Run,
    summary: &'a TrainSummary,
    n: usize,
    zero: u8,
    accum: usize,
    dropout: bool,
}

impl<'a> DpRun<'a> {
    /// None for runs that are not finished training runs.
    fn of(run: &'a Run) -> Option<Self> {
        let train = run.header.train.as_ref()?;
        Some(Self {
            run,
            summary: run.train_summary.as_ref()?,
            n: run.dp(),
            zero: run.header.dp.as_ref().map_or(0, |d| d.zero_stage),
            accum: train.grad_accum,
            dropout: train.dropout,
        })
    }

    fn model(&self) -> &str {
        &self.run.header.model.name
    }

    fn dtype(&self) -> &str {
        &self.run.header.dtype
    }

    /// Blocks per rank per optimizer step.
    fn per_rank(&self) -> usize {
        self.run.header.batch_size * self.accum
    }

    fn global(&self) -> usize {
        self.per_rank() * self.n
    }

    fn same_model(&self, o: &Self) -> bool {
        self.model() == o.model() && self.dtype() == o.dtype()
    }
}

/// Both tables for every directory, each under a `#### DIR` heading.
pub fn report(runs: &[Run]) -> Result<String> {
    let mut out = String::new();
    for (dir, runs) in by_dir(runs) {
        let runs: Vec<DpRun> = runs.into_iter().filter_map(DpRun::of).collect();
        out += &format!("#### {dir}\n\n");
        out += &equivalence(&runs);
        out += "\n";
        out += &scaling(&runs);
        out += "\n";
    }
    Ok(out)
}

fn equivalence(runs: &[DpRun]) -> String {
    let mut rows = vec![];
    for r in runs.iter().filter(|r| r.n > 1) {
        let bases = runs.iter().filter(|b| {
            b.n == 1 && b.same_model(r) && b.global() == r.global() && !b.dropout && !r.dropout
        });
        for b in bases {
            let (rs, bs) = (&r.run.steps, &b.run.steps);
            let k = rs.len().min(bs.len());
            if k == 0 {
                continue;
            }
            let max_rel = |f: fn(&crate::record::StepRecord) -> f64| {
                (0..k)
                    .map(|i| rel_diff(f(&rs[i]), f(&bs[i])))
                    .fold(f64::NEG_INFINITY, f64::max)
            };
            rows.push(vec![
                r.model().to_string(),
                r.dtype().to_string(),
                format!("dp {} ZeRO-{}", r.n, r.zero),
                format!("dp 1, grad_accum {}", b.accum),
                k.to_string(),
                sci(max_rel(|s| s.loss), 1),
                sci(max_rel(|s| s.grad_norm), 1),
            ]);
        }
    }
    md_rows(
        &[
            "model",
            "dtype",
            "run",
            "compared with",
            "steps",
            "loss rel. diff max",
            "grad norm rel. diff max",
        ],
        &rows,
    )
}

fn scaling(runs: &[DpRun]) -> String {
    let mut rows = vec![];
    for r in runs {
        let s = r.summary;
        let base = runs.iter().find(|b| {
            b.n == 1 && b.same_model(r) && b.per_rank() == r.per_rank() && b.dropout == r.dropout
        });
        let eff = base.map_or(f64::NAN, |b| {
            s.train_samples_per_second / (r.n as f64 * b.summary.train_samples_per_second)
        });
        let peaks = s
            .per_rank_peak_memory_bytes
            .clone()
            .unwrap_or_else(|| vec![s.peak_memory_bytes]);
        let peaks: Vec<String> = peaks
            .iter()
            .map(|p| format!("{:.2}", *p as f64 / (1u64 << 30) as f64))
            .collect();
        rows.push(vec![
            r.model().to_string(),
            r.dtype().to_string(),
            r.n.to_string(),
            r.zero.to_string(),
            r.global().to_string(),
            super::Fmt::Fixed(2).write(s.train_samples_per_second),
            super::Fmt::Fixed(3).write(eff),
            s.comm_share
                .map_or(String::new(), |c| format!("{:.1}%", c * 100.)),
            peaks.join(" / "),
            r.run.name.clone(),
        ]);
    }
    md_rows(
        &[
            "model",
            "dtype",
            "dp",
            "ZeRO",
            "global batch",
            "train_samples_per_second",
            "scaling efficiency",
            "all-reduce share",
            "peak GiB by rank",
            "log",
        ],
        &rows,
    )
}
