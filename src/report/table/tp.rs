//! Tensor-parallel LAMBADA runs against their tp 1 run of the same directory, model, dtype
//! and batch size:
//!
//! - `--table tp-agreement`: accuracy, perplexity, the per-passage log-likelihood of the
//!   target (|ll_N − ll_1| / |ll_1|, max and median) and how many passages' greedy flag
//!   differs. Where tp 1 ran at batch 1 and 16, the same comparison between those two: the
//!   noise floor (bf16 rounds differently with other padding).
//! - `--table tp-scaling`: samples/s, speed-up over tp 1, p50 batch latency, rank 0's peak
//!   memory and MFU (against one GPU's peak, so a group's figure).

use super::logs::{by_dir, rel_diff, Run};
use super::{md_rows, sci, Fmt};
use crate::error::Result;
use crate::metrics::percentile;
use crate::record::Summary;
use std::collections::{BTreeMap, HashMap};

/// (model, dtype, batch size): the runs that may be compared.
type Key = (String, String, usize);

/// A finished LAMBADA run: its passages (index -> (ll, greedy)) and summary.
struct TpRun<'a> {
    passages: HashMap<usize, (f64, bool)>,
    summary: &'a Summary,
    run: &'a Run,
}

/// The runs of one directory by key and tp degree; a later log of the same key and degree
/// replaces an earlier one.
fn group<'a>(runs: &[&'a Run]) -> BTreeMap<Key, BTreeMap<usize, TpRun<'a>>> {
    let mut out: BTreeMap<Key, BTreeMap<usize, TpRun>> = BTreeMap::new();
    for r in runs {
        let Some(summary) = r.summary.as_ref() else {
            continue;
        };
        let h = &r.header;
        let passages = r
            .batches
            .iter()
            .flat_map(|b| &b.passages)
            .map(|p| (p.index, (p.ll, p.greedy)))
            .collect();
        let key = (h.model.name.clone(), h.dtype.clone(), h.batch_size);
        let run = TpRun {
            passages,
            summary,
            run: r,
        };
        out.entry(key).or_default().insert(r.tp(), run);
    }
    out
}

/// One agreement row: `cmp` against `base`.
fn agreement_row(
    dir: &str,
    key: (&str, &str, String),
    what: &str,
    base: &TpRun,
    cmp: &TpRun,
) -> Vec<String> {
    let mut common: Vec<usize> = base
        .passages
        .keys()
        .filter(|i| cmp.passages.contains_key(i))
        .copied()
        .collect();
    common.sort_unstable();
    let mut rel: Vec<f64> = common
        .iter()
        .map(|i| rel_diff(cmp.passages[i].0, base.passages[i].0))
        .collect();
    let flips = common
        .iter()
        .filter(|i| cmp.passages[i].1 != base.passages[i].1)
        .count();
    rel.sort_by(f64::total_cmp);
    let ppl = rel_diff(cmp.summary.perplexity, base.summary.perplexity);
    let (model, dtype, batch) = key;
    vec![
        dir.to_string(),
        model.to_string(),
        dtype.to_string(),
        batch,
        what.to_string(),
        common.len().to_string(),
        format!(
            "{} / {}",
            Fmt::Fixed(4).write(base.summary.accuracy),
            Fmt::Fixed(4).write(cmp.summary.accuracy)
        ),
        sci(ppl, 1),
        sci(rel.last().copied().unwrap_or(f64::NAN), 1),
        sci(percentile(&rel, 50.), 1),
        flips.to_string(),
    ]
}

/// One table over every directory.
pub fn agreement(runs: &[Run]) -> Result<String> {
    let mut rows = vec![];
    for (dir, runs) in by_dir(runs) {
        let groups = group(&runs);
        for ((model, dtype, batch), by_tp) in &groups {
            let Some(base) = by_tp.get(&1) else { continue };
            for (tp, run) in by_tp.iter().filter(|(tp, _)| **tp > 1) {
                let key = (model.as_str(), dtype.as_str(), batch.to_string());
                rows.push(agreement_row(dir, key, &format!("tp {tp}"), base, run));
            }
            // The noise floor: tp 1 at batch 1 against tp 1 at batch 16.
            let other = groups.get(&(model.clone(), dtype.clone(), 16));
            if let (1, Some(b16)) = (*batch, other.and_then(|o| o.get(&1))) {
                let key = (model.as_str(), dtype.as_str(), "1 vs 16".to_string());
                rows.push(agreement_row(dir, key, "tp 1 (batch 16 vs 1)", b16, base));
            }
        }
    }
    Ok(md_rows(
        &[
            "dir",
            "model",
            "dtype",
            "batch",
            "compared with tp=1",
            "passages",
            "accuracy (first / second)",
            "perplexity rel. diff",
            "ll rel. diff max",
            "ll rel. diff median",
            "greedy flips",
        ],
        &rows,
    ))
}

/// One table; a `dir` column when the runs come from more than one directory.
pub fn scaling(runs: &[Run]) -> Result<String> {
    let dirs = by_dir(runs);
    let many = dirs.len() > 1;
    let mut rows = vec![];
    for (dir, runs) in &dirs {
        for ((model, dtype, batch), by_tp) in group(runs) {
            let base = by_tp.get(&1).map(|b| b.summary.samples_per_second);
            for (tp, r) in &by_tp {
                let s = r.summary;
                let speedup = match base {
                    Some(b) if *tp > 1 => format!("**{:.2}**", s.samples_per_second / b),
                    _ => String::new(),
                };
                let mut row = if many { vec![dir.to_string()] } else { vec![] };
                row.extend([
                    model.clone(),
                    dtype.clone(),
                    batch.to_string(),
                    tp.to_string(),
                    Fmt::Fixed(2).write(s.samples_per_second),
                    speedup,
                    Fmt::Fixed(2).write(s.latency_ms_p50),
                    Fmt::Bytes((1u64 << 30) as f64, 2).write(s.peak_memory_bytes as f64),
                    s.mfu.map_or(String::new(), |m| Fmt::Percent(1).write(m)),
                    r.run.name.clone(),
                ]);
                rows.push(row);
            }
        }
    }
    let mut headers = if many { vec!["dir"] } else { vec![] };
    headers.extend([
        "model",
        "dtype",
        "batch",
        "tp",
        "samples/s",
        "× tp 1",
        "p50 ms",
        "rank 0 peak GiB",
        "MFU (one GPU's peak)",
        "log",
    ]);
    Ok(md_rows(&headers, &rows))
}
