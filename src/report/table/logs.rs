//! Bench run logs read whole, for the reports that compare runs record by record (steps,
//! passages) rather than by their summaries. Runs are grouped by directory: one directory is
//! one host and one session, and runs are only compared within it.

use crate::error::{Error, Result};
use crate::record::{BatchRecord, Header, Record, StepRecord, Summary, TrainSummary};
use crate::report::row::read_maybe_gz;
use std::path::{Path, PathBuf};

/// One run log's records.
pub struct Run {
    /// The directory, as the input named it (`results/h200x2/dp`).
    pub dir: String,
    /// The file name (`wikitext2_…Z.jsonl.gz`).
    pub name: String,
    pub header: Header,
    pub steps: Vec<StepRecord>,
    pub batches: Vec<BatchRecord>,
    pub summary: Option<Summary>,
    pub train_summary: Option<TrainSummary>,
}

impl Run {
    pub fn tp(&self) -> usize {
        self.header.tp.as_ref().map_or(1, |t| t.size)
    }

    pub fn dp(&self) -> usize {
        self.header.dp.as_ref().map_or(1, |d| d.size)
    }
}

/// The run logs among `files`, in file order; files without a run-log header (e.g.
/// `host.txt`, sweep logs) are left out. None at all is an error.
pub fn read_runs(files: &[PathBuf]) -> Result<Vec<Run>> {
    let mut runs = vec![];
    for path in files {
        let text = String::from_utf8_lossy(&read_maybe_gz(path)?).into_owned();
        runs.extend(read_run(path, &text));
    }
    if runs.is_empty() {
        return Err(Error::Config(
            "no bench run logs in the inputs (or none match --where)".into(),
        ));
    }
    Ok(runs)
}

/// A run log's records; None for a log without a header (a sweep log). A line that is not a
/// record (a torn last line) is left out.
fn read_run(path: &Path, text: &str) -> Option<Run> {
    let mut header = None;
    let (mut steps, mut batches, mut summary, mut train_summary) = (vec![], vec![], None, None);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Header(h)) => header = Some(*h),
            Ok(Record::Step(s)) => steps.push(s),
            Ok(Record::Batch(b)) => batches.push(b),
            Ok(Record::Summary(s)) => summary = Some(*s),
            Ok(Record::TrainSummary(s)) => train_summary = Some(*s),
            _ => {}
        }
    }
    Some(Run {
        dir: path
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        header: header?,
        steps,
        batches,
        summary,
        train_summary,
    })
}

/// Runs grouped by directory, directories in the order they first appear.
pub fn by_dir(runs: &[Run]) -> Vec<(&str, Vec<&Run>)> {
    let mut out: Vec<(&str, Vec<&Run>)> = vec![];
    for r in runs {
        match out.iter_mut().find(|(d, _)| *d == r.dir) {
            Some((_, v)) => v.push(r),
            None => out.push((&r.dir, vec![r])),
        }
    }
    out
}

/// |a - b| / |b| (b kept away from 0).
pub fn rel_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}
