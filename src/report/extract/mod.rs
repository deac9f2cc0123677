//! `extract-metrics`: logs of every engine -> one table (polars) -> CSV or Markdown.
//!
//! One row per run: metadata columns (run, file, format, engine, suite, model, dtype, device,
//! gpu, …) then one numeric column per metric. A quantity has one name whatever tool logged it
//! ([`schema`]): the bench log's names (`samples_per_second`, `train_loss`, `eval_loss`…),
//! with `_last` for the value of the last logged step (`train_loss_last`,
//! `learning_rate_last`, `grad_norm_last`). Integer quantities (batch sizes, counts, bytes) are
//! written as integers.
//!
//! A CSV it wrote reads back as its rows where named ([`csv_rows`]). Every run gets the ratios
//! against the other runs of its call ([`derived`]).
//!
//! `--long` gives tidy (run, file, format, metric, value) rows; `--group-by` folds repeats
//! into median (under the metric's own name), `_min`, `_max` and a `count` column; `--ratio
//! A/B` pairs two engines' runs ([`crate::report::table::ratio`]); `--compare BASE` sets the
//! runs against a baseline group ([`crate::report::table::compare`]); `--table` prints a report
//! of parallel runs ([`crate::report::table`]). `--markdown` or `-o x.md` writes Markdown, by
//! default in the columns a person compares ([`crate::report::table::defaults`]).

mod bench_log;
mod csv_rows;
pub mod derived;
pub mod formats;
pub mod frame;
mod hf;
pub mod inputs;
mod llmc;
mod number;
pub mod schema;

use crate::error::{Error, Result};
use crate::report::filter::Where;
pub use crate::report::row::{column_names, polars_err, read_maybe_gz, Num, RunRow};
use crate::report::table::{self, Col, TableKind};
use clap::Parser;
use formats::{detect, parse, Format, FORMAT_NAMES};
pub use frame::{grouped_frame, long_frame, to_csv, wide_frame};
pub use inputs::{collect_inputs, Input};
use polars::prelude::DataFrame;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "extract-metrics",
    version,
    about = "Turns run logs (transformer-bench JSONL, HF Trainer output, llm.c logs) into one CSV or Markdown table.",
    after_help = "Formats (detected per file; --format forces one):\n  bench-jsonl          transformer-bench run logs (*.jsonl, *.jsonl.gz)\n  hf-trainer-log       HF Trainer / run_clm.py stdout\n  hf-trainer-results   all_results.json, train_results.json, eval_results.json\n  hf-trainer-state     trainer_state.json\n  llmc-log             llm.c stdout (step lines, val loss)\n  llmc-main-log        llm.c main.log (s:N trl:... lines)\n  extract-csv          a CSV extract-metrics wrote (*.csv; only where named)\n\nColumn formats (--columns NAME[:FMT][=LABEL]): .N decimals, eN scientific, %N a fraction as\npercent, GiB.N / MiB.N / GB.N bytes; LABEL is the Markdown header.\n\nExamples:\n  extract-metrics -i results/h100 -o results/h100.csv\n  extract-metrics -i 'logs/*.jsonl' --group-by model,dtype,engine\n  extract-metrics -i results/h100/engines --ratio candle/hf -o ratio.md\n  extract-metrics -i logs --where suite=lambada --columns model,dtype,samples_per_second:.1 --markdown\n  extract-metrics -i results/current/h100.csv --where suite=generation --where engine!=hf --markdown\n  extract-metrics -i results/h200x4/dp --table dp-report\n  extract-metrics -i new-logs --compare old-logs -o compare.md"
)]
pub struct Args {
    /// Log files, directories (searched recursively) or glob patterns; several allowed.
    #[arg(short, long = "input", value_name = "PATH", required = true, num_args = 1..)]
    pub inputs: Vec<String>,
    /// Output file: CSV, or Markdown when it ends in .md [default: stdout].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also (or only) a Markdown table, to FILE or, without one, to stdout.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub markdown: Option<PathBuf>,
    /// Read every input as this format instead of detecting it.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Tidy rows: run, file, format, metric, value.
    #[arg(long, conflicts_with = "group_by")]
    pub long: bool,
    /// Fold repeats: group by these columns (comma-separated), median/min/max/count per metric.
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub group_by: Vec<String>,
    /// Keep only rows whose column KEY equals VALUE (KEY!=VALUE: differs; repeatable; numbers
    /// compare as numbers).
    #[arg(long = "where", value_name = "KEY=VALUE")]
    pub filters: Vec<String>,
    /// Sort rows by these columns (comma-separated; dtype in the order fp32, tf32, bf16, fp16).
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub sort: Vec<String>,
    /// Output only these columns, in this order: NAME[:FMT][=LABEL] (comma-separated)
    /// [Markdown default: model, engine, attn, dtype, batch, tp/dp where several GPUs, GPU,
    /// throughput, latency p50/p99, peak memory, the ratios, each where some run has it; CSV
    /// default: every column].
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Ratio table of two engines, A/B (e.g. candle/hf): runs of one directory with the same
    /// model, suite, dtype, batch size, GPU, tp/dp and passage count, A's samples/s over B's.
    #[arg(long, value_name = "A/B", conflicts_with_all = ["long", "group_by"])]
    pub ratio: Option<String>,
    /// Compare with a baseline group of runs (logs, directories, globs or archives, as -i):
    /// per configuration, new / base samples/s with a 95 % interval and whether it leaves 1.
    #[arg(long, value_name = "BASE", num_args = 1.., conflicts_with_all = ["long", "group_by", "ratio"])]
    pub compare: Vec<String>,
    /// A Markdown report of parallel runs, per directory (one host, one session).
    #[arg(long, value_enum, conflicts_with_all = ["long", "group_by", "ratio", "columns", "sort"])]
    pub table: Option<TableKind>,
    /// Skip files in no known format (with a note on stderr) instead of failing.
    #[arg(long)]
    pub skip_unknown: bool,
}

/// Rows of every input; a `.tgz` archive's members are read as files (`ARCHIVE!MEMBER` in the
/// `file` column). A file in no known format is an error naming the formats where it was named
/// (or skipped with `skip_unknown`), and skipped where it was met walking a directory or inside
/// an archive (counted on stderr); unrecognised lines inside known files are counted on stderr.
/// A CSV is read only where named: met walking a results folder, it repeats the logs beside it.
pub fn extract(
    inputs: &[Input],
    format: Option<Format>,
    skip_unknown: bool,
) -> Result<Vec<RunRow>> {
    let mut rows = vec![];
    let mut unknown = 0;
    for input in inputs {
        let path = &input.path;
        if inputs::is_archive(path) {
            for (member, bytes) in inputs::archive_members(path)? {
                if is_csv(&member) {
                    unknown += 1;
                    continue;
                }
                let shown = format!("{}!{}", path.display(), member.display());
                match read_one(&member, &shown, &bytes, format) {
                    Some(found) => rows.extend(found),
                    None => unknown += 1,
                }
            }
            continue;
        }
        if input.walked && is_csv(path) {
            unknown += 1;
            continue;
        }
        let bytes = read_maybe_gz(path)?;
        let shown = path.display().to_string();
        match read_one(path, &shown, &bytes, format) {
            Some(found) => rows.extend(found),
            None if input.walked || skip_unknown => {
                if skip_unknown {
                    eprintln!("{shown}: skipped (no known format)");
                }
                unknown += 1;
            }
            None => {
                return Err(Error::Config(format!(
                    "{shown}: not a log format extract-metrics knows ({FORMAT_NAMES}); use --format to force one or --skip-unknown",
                )))
            }
        }
    }
    if unknown > 0 {
        eprintln!("skipped {unknown} file(s) in no known format (notes, profiles, console output; CSVs are read only where named)");
    }
    Ok(rows)
}

/// The rows of one file's `bytes` (`path` names it for detection, `shown` in the `file`
/// column), or None when it is in no known format.
fn read_one(path: &Path, shown: &str, bytes: &[u8], format: Option<Format>) -> Option<Vec<RunRow>> {
    let text = String::from_utf8_lossy(bytes);
    // `run.jsonl.gz` is detected and named as `run.jsonl`.
    let plain = path.with_extension("");
    let named = if inputs::is_gz(path) {
        plain.as_path()
    } else {
        path
    };
    let fmt = format.or_else(|| detect(named, &text))?;
    let (mut found, skipped) = parse(fmt, named, &text);
    // A CSV's rows keep the log each came from.
    if fmt != Format::ExtractCsv {
        for row in &mut found {
            row.meta.insert("file".into(), shown.to_string());
        }
    }
    if skipped > 0 {
        eprintln!(
            "{shown}: skipped {skipped} unrecognised line(s) ({})",
            fmt.name()
        );
    }
    if found.is_empty() {
        eprintln!("{shown}: no metrics found ({})", fmt.name());
    }
    Some(found)
}

fn is_csv(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "csv")
}

/// The bench run logs among `files` whose row satisfies `wheres`: what `--table` reads.
fn bench_logs(files: &[PathBuf], wheres: &[Where]) -> Result<Vec<PathBuf>> {
    let mut keep = vec![];
    for path in files {
        let text = String::from_utf8_lossy(&read_maybe_gz(path)?).into_owned();
        let plain = path.with_extension("");
        let named = if inputs::is_gz(path) { &plain } else { path };
        if detect(named, &text) != Some(Format::BenchJsonl) {
            continue;
        }
        let (rows, _) = parse(Format::BenchJsonl, named, &text);
        if rows
            .first()
            .is_some_and(|r| wheres.iter().all(|w| w.matches(r.cell(&w.key).as_deref())))
        {
            keep.push(path.clone());
        }
    }
    Ok(keep)
}

/// Keeps the rows that satisfy every condition; a KEY no row has is an error.
pub fn filter_rows(rows: &mut Vec<RunRow>, wheres: &[Where]) -> Result<()> {
    for w in wheres {
        if !rows.iter().any(|r| r.has(&w.key)) {
            return Err(Error::Config(format!(
                "--where {}: no run has a column '{}'",
                w.text(),
                w.key
            )));
        }
    }
    rows.retain(|r| wheres.iter().all(|w| w.matches(r.cell(&w.key).as_deref())));
    Ok(())
}

/// Sorts rows by `cols` (numbers as numbers, dtype by precision); a column no row has is an error.
pub fn sort_rows(rows: &mut [RunRow], cols: &[String]) -> Result<()> {
    for c in cols {
        if !rows.iter().any(|r| r.has(c)) {
            return Err(Error::Config(format!("--sort: no run has a column '{c}'")));
        }
    }
    rows.sort_by(|a, b| {
        cols.iter()
            .map(|c| table::compare_cells(c, a.cell(c).as_deref(), b.cell(c).as_deref()))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    Ok(())
}

/// Where the CSV and the Markdown go: `-o x.md` or `--markdown [FILE]` mean Markdown (stdout
/// when no file is named); CSV goes to `-o` when it is not Markdown, or to stdout when no
/// Markdown was asked for.
fn sinks(args: &Args) -> Result<(Option<PathBuf>, Option<PathBuf>)> {
    let is_md = |p: &PathBuf| p.extension().is_some_and(|e| e == "md");
    match (&args.output, &args.markdown) {
        (Some(o), Some(_)) if is_md(o) => Err(Error::Config(
            "two Markdown outputs: give -o FILE.md or --markdown FILE, not both".into(),
        )),
        (Some(o), md) if is_md(o) => Ok((None, md.clone().or(Some(o.clone())))),
        (Some(o), md) => Ok((Some(o.clone()), md.clone())),
        (None, Some(md)) => Ok((None, Some(md.clone()))),
        (None, None) => Ok((Some(PathBuf::from("-")), None)),
    }
}

/// Writes `bytes` to a file, or to stdout for `-`.
fn write_to(path: &Path, bytes: &[u8], what: &str) -> Result<()> {
    if path.as_os_str() == "-" {
        use std::io::Write;
        return std::io::stdout()
            .write_all(bytes)
            .map_err(|e| Error::io("writing stdout", e));
    }
    std::fs::write(path, bytes).map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    eprintln!("{what} -> {}", path.display());
    Ok(())
}

/// The table the flags ask for, with its Markdown columns.
fn build_table(args: &Args, rows: &[RunRow], wheres: &[Where]) -> Result<(DataFrame, Vec<Col>)> {
    if !args.compare.is_empty() {
        let mut base = extract(
            &collect_inputs(&args.compare)?,
            args.format,
            args.skip_unknown,
        )?;
        filter_rows(&mut base, wheres)?;
        return table::compare::compare_table(rows, &base);
    }
    if let Some(spec) = &args.ratio {
        let pair = table::ratio::Pair::parse(spec)?;
        return table::ratio::ratio_table(rows, &pair);
    }
    if args.long {
        let df = long_frame(rows)?;
        let cols = Col::all(&df);
        return Ok((df, cols));
    }
    let df = if args.group_by.is_empty() {
        wide_frame(rows)?
    } else {
        grouped_frame(wide_frame(rows)?, &args.group_by)?
    };
    // Markdown is for people: the columns they compare (the CSV keeps every column), after
    // the groups' own columns.
    let mut cols: Vec<Col> = args
        .group_by
        .iter()
        .map(|c| Col::new(c, c, table::Fmt::Auto))
        .collect();
    let defaults = table::defaults::default_columns(&df)?;
    cols.extend(
        defaults
            .into_iter()
            .filter(|d| !args.group_by.contains(&d.name)),
    );
    Ok((df, cols))
}

pub fn run(args: Args) -> Result<()> {
    let wheres = Where::parse_all(&args.filters)?;
    let specs = args
        .columns
        .iter()
        .map(|s| Col::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let files = collect_inputs(&args.inputs)?;
    let (csv_to, md_to) = sinks(&args)?;
    if let Some(kind) = args.table {
        let paths: Vec<PathBuf> = files.iter().map(|f| f.path.clone()).collect();
        let text = table::report(kind, &bench_logs(&paths, &wheres)?)?;
        return write_to(
            &md_to.or(csv_to).unwrap_or_default(),
            text.as_bytes(),
            "table",
        );
    }
    let mut rows = extract(&files, args.format, args.skip_unknown)?;
    // Ratios over every run read, before --where narrows what is shown.
    derived::add(&mut rows);
    filter_rows(&mut rows, &wheres)?;
    sort_rows(&mut rows, &args.sort)?;
    if rows.is_empty() {
        return Err(Error::Config("no runs found in the inputs".into()));
    }
    let (df, mut cols) = build_table(&args, &rows, &wheres)?;
    let mut df = if specs.is_empty() {
        df
    } else {
        cols = specs;
        table::select(&df, &cols)?
    };
    if let Some(p) = &csv_to {
        let what = format!("{} rows from {} files", df.height(), files.len());
        write_to(p, &to_csv(&mut df)?, &what)?;
    }
    if let Some(p) = &md_to {
        let what = format!("{} rows (Markdown)", df.height());
        write_to(p, table::markdown(&df, &cols)?.as_bytes(), &what)?;
    }
    Ok(())
}

/// Entry point of the `extract-metrics` binary.
pub fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => return crate::report::clap_exit(e),
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::from(2)
        }
    }
}
