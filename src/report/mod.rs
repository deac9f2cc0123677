//! Reports: what turns run records into something to read.
//!
//! - [`console`]: the tables `bench` prints after a run (always built); [`console_serving`]:
//!   the serving suite's.
//!
//! With the `report` feature, reading results back: run logs of every engine -> rows -> CSV,
//! Markdown tables and charts. That part reads what `bench` (or HF Trainer, or llm.c) wrote and
//! depends only on the log contract ([`crate::record`]) and the metric definitions
//! ([`crate::metrics`]).
//!
//! - [`row`]: one run's row (metadata, numbers), the polars helpers, reading a gzipped log:
//!   the bottom layer, which imports nothing else of `report`.
//! - [`extract`]: `extract-metrics`, logs (or its own CSVs) -> one row per run, with the
//!   ratios to the other runs of its call (polars) -> CSV or Markdown, and the report tables
//!   it can print instead ([`table`]). The command sits on top: it imports
//!   `table`, which imports only `row`.
//! - [`table`]: Markdown rendering with per-column formats, the ratio table of two engines,
//!   and the data- / tensor-parallel reports that compare runs step by step or passage by
//!   passage.
//! - [`filter`]: `--where KEY=VALUE`, shared by both binaries.
//! - [`plot`]: `plot`, an extract-metrics CSV -> a PNG or SVG chart.

pub mod console;
pub mod console_serving;
#[cfg(feature = "report")]
pub mod extract;
#[cfg(feature = "report")]
pub mod filter;
#[cfg(feature = "report")]
pub mod plot;
#[cfg(feature = "report")]
pub mod row;
#[cfg(feature = "report")]
pub mod table;

#[cfg(feature = "report")]
/// A command-line error of either binary in one line (clap's own ends with a usage hint on
/// further lines); `--help` and `--version` print as clap prints them.
pub(crate) fn clap_exit(e: clap::Error) -> std::process::ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return std::process::ExitCode::SUCCESS;
    }
    // The message is the lines before the first blank one (tips and usage follow it).
    let text = e.to_string();
    let head: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let head = head.join(" ");
    let head = head.strip_prefix("error: ").unwrap_or(&head);
    eprintln!("Error: {head} (see --help)");
    std::process::ExitCode::from(2)
}
