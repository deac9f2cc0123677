//! Every log format extract-metrics reads: which one a file is in, and the dispatch to its
//! parser (bench JSONL in `bench_log`, HF Trainer in `hf`, llm.c in `llmc`, its own CSV in
//! `csv_rows`). Each maps a file into [`RunRow`]s (run metadata + numeric metrics, under the
//! names of [`super::schema`]); lines a parser does not recognise are counted, never fatal.

use super::{bench_log, csv_rows, hf, llmc};
use crate::report::row::RunRow;
use std::collections::BTreeMap;
use std::path::Path;

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
    /// A CSV extract-metrics wrote (`*.csv`), read back row by row; only where named, since a
    /// results folder's CSVs repeat its logs.
    ExtractCsv,
}

pub const FORMAT_NAMES: &str =
    "bench-jsonl, hf-trainer-log, hf-trainer-results, hf-trainer-state, llmc-log, llmc-main-log, extract-csv";

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::BenchJsonl => "bench-jsonl",
            Format::HfTrainerLog => "hf-trainer-log",
            Format::HfTrainerResults => "hf-trainer-results",
            Format::HfTrainerState => "hf-trainer-state",
            Format::LlmcLog => "llmc-log",
            Format::LlmcMainLog => "llmc-main-log",
            Format::ExtractCsv => "extract-csv",
        }
    }
}

impl RunRow {
    /// An empty row of a file in `format`.
    pub fn new(path: &Path, format: Format) -> Self {
        // A run is named by its file, or by its directory for HF Trainer's fixed file names.
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let run = match format {
            Format::HfTrainerResults | Format::HfTrainerState => path
                .parent()
                .and_then(|p| p.file_name())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or(stem),
            _ => stem,
        };
        let meta = BTreeMap::from([
            ("run".to_string(), run),
            ("file".to_string(), path.display().to_string()),
            ("format".to_string(), format.name().to_string()),
        ]);
        Self {
            meta,
            metrics: BTreeMap::new(),
        }
    }
}

/// Which format a file is in, from its name and content; None if no parser knows it.
pub fn detect(path: &Path, text: &str) -> Option<Format> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if name.ends_with(".csv") {
        return Some(Format::ExtractCsv);
    }
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
    if hf::is_trainer_log(text) {
        return Some(Format::HfTrainerLog);
    }
    if text.lines().any(|l| llmc::is_step_line(l.trim_end())) {
        return Some(Format::LlmcLog);
    }
    if text.lines().any(|l| llmc::is_main_log_line(l.trim_end())) {
        return Some(Format::LlmcMainLog);
    }
    None
}

/// Parses `text` as `format`: the rows and the number of lines skipped.
pub fn parse(format: Format, path: &Path, text: &str) -> (Vec<RunRow>, usize) {
    let mut row = RunRow::new(path, format);
    let skipped = match format {
        Format::BenchJsonl => return bench_log::parse(row, text),
        Format::ExtractCsv => {
            return csv_rows::parse(&row, text).map_or((vec![], 1), |rows| (rows, 0));
        }
        Format::HfTrainerLog => hf::trainer_log(&mut row, text),
        Format::HfTrainerResults => hf::results_json(&mut row, text),
        Format::HfTrainerState => hf::trainer_state(&mut row, text),
        Format::LlmcLog => llmc::stdout_log(&mut row, text),
        Format::LlmcMainLog => llmc::main_log(&mut row, text),
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
