//! `extract-metrics`: logs of every engine -> one table (polars) -> CSV.
//!
//! One row per run: metadata columns (run, file, format, engine, suite, model, dtype, device,
//! gpu, …) then one numeric column per metric, in the names each tool uses (ours:
//! `samples_per_second`, `latency_ms_p50`…; HF Trainer: `train_samples_per_second`…).
//! `--long` gives tidy (run, file, format, metric, value) rows; `--group-by` folds repeats
//! into median (under the metric's own name), `_min`, `_max` and a `count` column.

pub mod formats;

use crate::error::{Error, Result};
use clap::Parser;
use formats::{detect, parse, Format, FORMAT_NAMES};
use polars::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Metadata columns, in output order (present ones only).
const META: &[&str] = &[
    "run",
    "file",
    "format",
    "engine",
    "suite",
    "model",
    "dtype",
    "device",
    "gpu",
    "attn",
    "status",
    "error",
    "git_commit",
    "time_utc",
];

/// One run's row before it becomes a table row.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRow {
    pub meta: BTreeMap<String, String>,
    pub metrics: BTreeMap<String, f64>,
}

impl RunRow {
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

#[derive(Parser, Debug)]
#[command(
    name = "extract-metrics",
    version,
    about = "Turns run logs (transformer-bench JSONL, HF Trainer output, llm.c logs) into one CSV.",
    after_help = "Formats (detected per file; --format forces one):\n  bench-jsonl          transformer-bench run logs (*.jsonl)\n  hf-trainer-log       HF Trainer / run_clm.py stdout\n  hf-trainer-results   all_results.json, train_results.json, eval_results.json\n  hf-trainer-state     trainer_state.json\n  llmc-log             llm.c stdout (step lines, val loss)\n  llmc-main-log        llm.c main.log (s:N trl:... lines)\n\nExample:\n  extract-metrics -i results/h100 -o results/h100.csv\n  extract-metrics -i 'logs/*.jsonl' --group-by model,dtype,engine"
)]
pub struct Args {
    /// Log files, directories (searched recursively) or glob patterns; several allowed.
    #[arg(short, long = "input", value_name = "PATH", required = true, num_args = 1..)]
    pub inputs: Vec<String>,
    /// CSV output file [default: stdout].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Read every input as this format instead of detecting it.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Tidy rows: run, file, format, metric, value.
    #[arg(long, conflicts_with = "group_by")]
    pub long: bool,
    /// Fold repeats: group by these columns (comma-separated), median/min/max/count per metric.
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub group_by: Vec<String>,
    /// Skip files in no known format (with a note on stderr) instead of failing.
    #[arg(long)]
    pub skip_unknown: bool,
}

/// Files named by `inputs`: files as given, directories walked (sorted), globs expanded.
/// In a directory holding HF's all_results.json, train/eval_results.json are left out (it
/// holds both).
pub fn collect_inputs(inputs: &[String]) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    for input in inputs {
        let path = PathBuf::from(input);
        if path.is_dir() {
            walk(&path, &mut out)?;
        } else if path.is_file() {
            out.push(path);
        } else if input.contains(['*', '?', '[']) {
            let paths = glob::glob(input)
                .map_err(|e| Error::Config(format!("bad pattern '{input}': {e}")))?;
            let mut matched: Vec<PathBuf> = paths
                .filter_map(|p| p.ok())
                .filter(|p| p.is_file())
                .collect();
            if matched.is_empty() {
                return Err(Error::Config(format!("no file matches '{input}'")));
            }
            matched.sort();
            out.extend(matched);
        } else {
            return Err(Error::NotFound {
                what: "input".into(),
                path,
                hint: "give log files, directories or glob patterns".into(),
            });
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let has_all = entries
        .iter()
        .any(|p| p.file_name().is_some_and(|n| n == "all_results.json"));
    for p in entries {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if p.is_dir() {
            walk(&p, out)?;
        } else if !(has_all && (name == "train_results.json" || name == "eval_results.json")) {
            out.push(p);
        }
    }
    Ok(())
}

/// Rows of every file. Unknown files are an error naming the formats, or skipped with
/// `skip_unknown`; unrecognised lines inside known files are counted on stderr.
pub fn extract(
    files: &[PathBuf],
    format: Option<Format>,
    skip_unknown: bool,
) -> Result<Vec<RunRow>> {
    let mut rows = vec![];
    for path in files {
        let bytes = read_maybe_gz(path)?;
        let text = String::from_utf8_lossy(&bytes);
        // `run.jsonl.gz` is detected and named as `run.jsonl`.
        let plain = path.with_extension("");
        let named = if is_gz(path) { plain.as_path() } else { path };
        let Some(fmt) = format.or_else(|| detect(named, &text)) else {
            if skip_unknown {
                eprintln!("{}: skipped (no known format)", path.display());
                continue;
            }
            return Err(Error::Config(format!(
                "{}: not a log format extract-metrics knows ({FORMAT_NAMES}); use --format to force one or --skip-unknown",
                path.display()
            )));
        };
        let (mut found, skipped) = parse(fmt, named, &text);
        for row in &mut found {
            row.meta.insert("file".into(), path.display().to_string());
        }
        if skipped > 0 {
            eprintln!(
                "{}: skipped {skipped} unrecognised line(s) ({})",
                path.display(),
                fmt.name()
            );
        }
        if found.is_empty() {
            eprintln!("{}: no metrics found ({})", path.display(), fmt.name());
        }
        rows.extend(found);
    }
    Ok(rows)
}

fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// A file's bytes, gunzipped if its name ends in `.gz`.
fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if !is_gz(path) {
        return Ok(bytes);
    }
    let mut out = vec![];
    flate2::read::MultiGzDecoder::new(&bytes[..])
        .read_to_end(&mut out)
        .map_err(|e| Error::io(format!("gunzipping {}", path.display()), e))?;
    Ok(out)
}

/// One row per run: metadata (string) columns, then metric (f64) columns, sorted by name.
pub fn wide_frame(rows: &[RunRow]) -> Result<DataFrame> {
    let metas: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.meta.keys().map(String::as_str))
        .collect();
    let metrics: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.metrics.keys().map(String::as_str))
        .collect();
    let mut cols: Vec<Column> = vec![];
    let ordered = META
        .iter()
        .copied()
        .filter(|m| metas.contains(m))
        .chain(metas.iter().copied().filter(|m| !META.contains(m)));
    for m in ordered {
        let v: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.meta.get(m).map(String::as_str))
            .collect();
        cols.push(Column::new(m.into(), v));
    }
    for m in metrics {
        let v: Vec<Option<f64>> = rows.iter().map(|r| r.metrics.get(m).copied()).collect();
        cols.push(Column::new(m.into(), v));
    }
    DataFrame::new(rows.len(), cols).map_err(polars_err)
}

/// Tidy rows: run, file, format, metric, value.
pub fn long_frame(rows: &[RunRow]) -> Result<DataFrame> {
    let (mut run, mut file, mut format, mut metric, mut value) =
        (vec![], vec![], vec![], vec![], vec![]);
    for r in rows {
        for (k, v) in &r.metrics {
            run.push(r.meta["run"].clone());
            file.push(r.meta["file"].clone());
            format.push(r.meta["format"].clone());
            metric.push(k.clone());
            value.push(*v);
        }
    }
    let height = run.len();
    DataFrame::new(
        height,
        vec![
            Column::new("run".into(), run),
            Column::new("file".into(), file),
            Column::new("format".into(), format),
            Column::new("metric".into(), metric),
            Column::new("value".into(), value),
        ],
    )
    .map_err(polars_err)
}

/// Repeats folded: per group, every metric's median (its own name), `_min`, `_max`; `count` rows.
pub fn grouped_frame(df: DataFrame, by: &[String]) -> Result<DataFrame> {
    for c in by {
        if df.column(c).is_err() {
            return Err(Error::Config(format!(
                "--group-by: no column '{c}' (columns: {})",
                column_names(&df)
            )));
        }
    }
    let metrics: Vec<String> = df
        .columns()
        .iter()
        .filter(|c| c.dtype() == &DataType::Float64 && !by.contains(&c.name().to_string()))
        .map(|c| c.name().to_string())
        .collect();
    let mut aggs = vec![len().alias("count")];
    for m in &metrics {
        aggs.push(col(m.as_str()).median().alias(m.as_str()));
        aggs.push(col(m.as_str()).min().alias(format!("{m}_min")));
        aggs.push(col(m.as_str()).max().alias(format!("{m}_max")));
    }
    let keys: Vec<Expr> = by.iter().map(|c| col(c.as_str())).collect();
    df.lazy()
        .group_by_stable(keys)
        .agg(aggs)
        .collect()
        .map_err(polars_err)
}

pub fn column_names(df: &DataFrame) -> String {
    df.get_column_names()
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn polars_err(e: PolarsError) -> Error {
    Error::Config(format!("table error: {e}"))
}

/// CSV bytes of a frame.
pub fn to_csv(df: &mut DataFrame) -> Result<Vec<u8>> {
    let mut buf = vec![];
    CsvWriter::new(&mut buf).finish(df).map_err(polars_err)?;
    Ok(buf)
}

pub fn run(args: Args) -> Result<()> {
    let files = collect_inputs(&args.inputs)?;
    let rows = extract(&files, args.format, args.skip_unknown)?;
    if rows.is_empty() {
        return Err(Error::Config("no runs found in the inputs".into()));
    }
    let mut df = if args.long {
        long_frame(&rows)?
    } else if !args.group_by.is_empty() {
        grouped_frame(wide_frame(&rows)?, &args.group_by)?
    } else {
        wide_frame(&rows)?
    };
    let csv = to_csv(&mut df)?;
    match &args.output {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::write(p, &csv)
                .map_err(|e| Error::io(format!("writing {}", p.display()), e))?;
            eprintln!(
                "{} rows from {} files -> {}",
                df.height(),
                files.len(),
                p.display()
            );
        }
        _ => {
            use std::io::Write;
            std::io::stdout()
                .write_all(&csv)
                .map_err(|e| Error::io("writing stdout", e))?;
        }
    }
    Ok(())
}

/// Entry point of the `extract-metrics` binary.
pub fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(2)
        }
    }
}
