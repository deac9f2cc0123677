//! Sweeps: the product `--models × --dtypes × --seq-lens × --batch-sizes × --engines`, each
//! configuration `--repeat N` times, as one command.
//!
//! Every run is a child process (this binary again, told its one configuration through
//! [`CHILD_ENV`]), like optimum-benchmark's process launcher: a CUDA out-of-memory, a crash or
//! the kernel's OOM killer ends that child only. The parent records how each child ended in
//! `sweep.jsonl` ([`SweepRun`]: `ok`, `oom`, `error`, `killed`), completes a dead child's run
//! log with a summary of its finished batches, and goes on. Each record is one write, so a
//! `kill -9` of the sweep loses nothing finished; children die with the parent
//! (`PR_SET_PDEATHSIG`), and `--resume` runs only what is missing.
//!
//! Layout: `LOG_DIR/sweep_TIME/` holds `sweep.jsonl` and the runs' own logs, so
//! `extract-metrics -i LOG_DIR/sweep_TIME` gives one row per run, including runs that failed
//! before writing a log (from their `sweep_run` record).

use crate::error::{Error, Result};
use crate::log::{read_log, RunLog};
use crate::metrics::serving::{ServingEnd, Slo};
use crate::metrics::{spread, BatchTotals, EvalResult, TrainTotals};
use crate::record::{
    Record, RequestRecord, RunStatus, ServingInfo, SweepConfig, SweepHeader, SweepRepeats,
    SweepRun, SCHEMA_VERSION,
};
/// The sweep log's name and a sweep's outcome live with the sweep's records (the console
/// prints them too); re-exported where the sweep is run.
pub use crate::record::{SweepOutcome, SWEEP_LOG};
use crate::trackers::MemoryReading;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Set in a child's environment: its [`ChildTask`] as JSON.
pub const CHILD_ENV: &str = "BENCH_SWEEP_CHILD";

/// What a child runs: one configuration, one repeat, logging into the sweep directory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChildTask {
    pub config: SweepConfig,
    pub repeat: usize,
    pub log_dir: PathBuf,
}

impl ChildTask {
    /// The task of this process, if a sweep started it.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(CHILD_ENV) {
            Ok(json) => serde_json::from_str(&json)
                .map(Some)
                .map_err(|e| Error::Config(format!("bad {CHILD_ENV}: {e}"))),
            Err(_) => Ok(None),
        }
    }
}

pub struct SweepOptions {
    pub suite: String,
    pub device: String,
    pub configs: Vec<SweepConfig>,
    pub repeat: usize,
    /// Where run logs go; a new sweep makes `log_dir/sweep_TIME/` in it.
    pub log_dir: PathBuf,
    /// Continue this sweep directory (else the newest `sweep_*` in `log_dir` with `resume`).
    pub sweep_dir: Option<PathBuf>,
    pub resume: bool,
    /// Kill a run that takes longer (status `timeout`): a stalled run costs one configuration.
    pub run_timeout: Option<std::time::Duration>,
    pub progress: bool,
    /// This process's arguments, given unchanged to every child.
    pub child_args: Vec<String>,
    pub command_line: Vec<String>,
}

/// Finds or makes the sweep directory.
fn sweep_dir(opts: &SweepOptions) -> Result<PathBuf> {
    if let Some(dir) = &opts.sweep_dir {
        if opts.resume && !dir.join(SWEEP_LOG).is_file() {
            return Err(Error::NotFound {
                what: "sweep log".into(),
                path: dir.join(SWEEP_LOG),
                hint: "--resume continues a sweep directory made by an earlier sweep".into(),
            });
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        return Ok(dir.clone());
    }
    if opts.resume {
        let newest = std::fs::read_dir(&opts.log_dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("sweep_"))
                    && p.join(SWEEP_LOG).is_file()
            })
            .max();
        return newest.ok_or_else(|| Error::NotFound {
            what: "sweep to resume".into(),
            path: opts.log_dir.clone(),
            hint: "run the sweep without --resume first, or pass --sweep-dir DIR".into(),
        });
    }
    let stem = format!("sweep_{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ"));
    for n in 0.. {
        let dir = match n {
            0 => opts.log_dir.join(&stem),
            n => opts.log_dir.join(format!("{stem}-{n}")),
        };
        std::fs::create_dir_all(&opts.log_dir)
            .map_err(|e| Error::io(format!("creating {}", opts.log_dir.display()), e))?;
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(format!("creating {}", dir.display()), e)),
        }
    }
    unreachable!()
}

/// Run logs (`*.jsonl` but the sweep log) in `dir`, sorted.
fn run_logs(dir: &Path) -> Result<BTreeSet<String>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    Ok(entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jsonl") && n != SWEEP_LOG)
        .collect())
}

/// How a run ended, as its log's summary says: LAMBADA and generation runs (samples/s and
/// batch latency), training runs (train samples/s and step latency) or serving runs
/// (requests/s, output tokens/s and the requests' end-to-end latency).
#[derive(Clone, Debug, PartialEq)]
pub struct RunEnd {
    pub status: RunStatus,
    pub error: Option<String>,
    pub samples_per_second: f64,
    pub latency_ms_p50: f64,
    pub tokens_per_second: f64,
}

impl RunEnd {
    /// The run's end, if `record` is a summary.
    pub fn of(record: &Record) -> Option<Self> {
        match record {
            Record::Summary(s) => Some(Self {
                status: s.status.clone(),
                error: s.error.clone(),
                samples_per_second: s.samples_per_second,
                latency_ms_p50: s.latency_ms_p50,
                tokens_per_second: s.tokens_per_second,
            }),
            Record::TrainSummary(s) => Some(Self {
                status: s.status.clone(),
                error: s.error.clone(),
                samples_per_second: s.train_samples_per_second,
                latency_ms_p50: s.step_latency_ms_p50,
                tokens_per_second: s.tokens_per_second,
            }),
            Record::ServingSummary(s) => Some(Self {
                status: s.status.clone(),
                error: s.error.clone(),
                samples_per_second: s.requests_per_second,
                latency_ms_p50: s.e2e_ms.p50,
                tokens_per_second: s.output_tokens_per_second,
            }),
            _ => None,
        }
    }
}

/// Appends a summary of its finished batches (or training steps) to a run log that has none
/// (its process died), with `status` from `failure`'s words, or `killed_as` (`killed`,
/// `timeout`) when the words say no more than `error`. Returns how the run ended, from the
/// log's summary, old or new.
pub fn complete_log(
    path: &Path,
    failure: &str,
    killed_as: Option<RunStatus>,
) -> Result<Option<RunEnd>> {
    let records = read_log(path)?;
    if let Some(end) = records.iter().find_map(RunEnd::of) {
        return Ok(Some(end));
    }
    let Some(header) = records.iter().find_map(|r| match r {
        Record::Header(h) => Some(h),
        _ => None,
    }) else {
        return Ok(None);
    };
    let mut summary = if let Some(info) = &header.serving {
        serving_summary_of(&records, info, failure)
    } else if header.train.is_some() {
        train_summary_of(&records, header.warmup_batches, failure)
    } else {
        batch_summary_of(&records, failure)
    };
    if let Some(status) = killed_as {
        match &mut summary {
            Record::Summary(s) if s.status == RunStatus::Error => s.status = status,
            Record::TrainSummary(s) if s.status == RunStatus::Error => s.status = status,
            Record::ServingSummary(s) if s.status == RunStatus::Error => s.status = status,
            _ => {}
        }
    }
    RunLog::append(path)?.write(&summary)?;
    Ok(RunEnd::of(&summary))
}

/// The summary of a dead run's finished batches.
fn batch_summary_of(records: &[Record], failure: &str) -> Record {
    let mut totals = BatchTotals::default();
    for r in records {
        if let Record::Batch(b) = r {
            totals.add(b);
        }
    }
    let mut summary = totals.summary(
        Some(failure.to_string()),
        f64::NAN,
        MemoryReading::default(),
    );
    // Whatever was measured of the process's memory died with it.
    summary.peak_host_memory_bytes = None;
    Record::Summary(Box::new(summary))
}

/// The summary of a dead serving run's served requests, goodput under the header's SLO.
fn serving_summary_of(records: &[Record], info: &ServingInfo, failure: &str) -> Record {
    let requests: Vec<RequestRecord> = records
        .iter()
        .filter_map(|r| match r {
            Record::Request(q) => Some((**q).clone()),
            _ => None,
        })
        .collect();
    let slo = (info.slo_ttft_ms.is_some() || info.slo_tpot_ms.is_some()).then_some(Slo {
        ttft_ms: info.slo_ttft_ms,
        tpot_ms: info.slo_tpot_ms,
    });
    let end = ServingEnd {
        n_batches: requests.iter().map(|r| r.batch + 1).max().unwrap_or(0),
        // Continuous batching's mean rows a step is not in the requests' records.
        batch_size_mean: info.batching.starts_with("continuous").then_some(f64::NAN),
        failure: Some(failure.to_string()),
        wall_seconds: f64::NAN,
        memory: MemoryReading::default(),
    };
    let mut summary = crate::metrics::serving::summary(&requests, slo.as_ref(), end);
    summary.peak_host_memory_bytes = None;
    Record::ServingSummary(Box::new(summary))
}

/// The summary of a dead training run's finished steps (no evaluation).
fn train_summary_of(records: &[Record], warmup: usize, failure: &str) -> Record {
    let mut totals = TrainTotals::default();
    for r in records {
        if let Record::Step(s) = r {
            totals.add(s);
        }
    }
    let eval = EvalResult {
        loss: f64::NAN,
        runtime_seconds: f64::NAN,
        n_blocks: 0,
    };
    let failure = Error::Engine(failure.to_string());
    let mut summary = totals.summary(Some(&failure), warmup, eval, false);
    summary.peak_host_memory_bytes = None;
    Record::TrainSummary(Box::new(summary))
}

/// How a child process ended, from its exit status and the tail of its stderr.
fn classify(
    status: std::process::ExitStatus,
    stderr_tail: &[String],
) -> (RunStatus, Option<String>) {
    use std::os::unix::process::ExitStatusExt;
    if status.success() {
        return (RunStatus::Ok, None);
    }
    // The child prints its error once as `Error: …`; else its last words say what happened.
    let said = stderr_tail
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("Error: "))
        .map(str::to_string);
    let tail = stderr_tail.join("\n");
    match (status.signal(), said) {
        (_, Some(msg)) => (RunStatus::of_failure(&msg), Some(msg)),
        (Some(sig), None) => {
            let status = match RunStatus::of_failure(&tail) {
                RunStatus::Oom => RunStatus::Oom,
                _ => RunStatus::Killed,
            };
            let why = match sig {
                9 => " (SIGKILL: the kernel's OOM killer, or kill -9)",
                6 => " (SIGABRT)",
                11 => " (SIGSEGV)",
                _ => "",
            };
            // The line that says why: an allocation failure if there is one, else the last.
            let last = stderr_tail
                .iter()
                .rev()
                .find(|l| RunStatus::of_failure(l) == RunStatus::Oom)
                .or(stderr_tail.last())
                .map(|l| format!(": {l}"))
                .unwrap_or_default();
            (status, Some(format!("killed by signal {sig}{why}{last}")))
        }
        (None, None) => (
            RunStatus::of_failure(&tail),
            Some(format!(
                "exit code {}: {}",
                status.code().unwrap_or(-1),
                stderr_tail.last().cloned().unwrap_or_default()
            )),
        ),
    }
}

/// Runs one child to its end, or kills it after `--run-timeout`: forwards its stderr and
/// returns (exit status, the last lines of its stderr, whether it was timed out).
fn run_child(
    opts: &SweepOptions,
    task: &ChildTask,
    bar: &ProgressBar,
) -> Result<(std::process::ExitStatus, Vec<String>, bool)> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::io("finding the bench executable for the sweep's children", e))?;
    let mut cmd = Command::new(exe);
    cmd.args(&opts.child_args)
        .env(
            CHILD_ENV,
            serde_json::to_string(task).expect("task serializes"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    super::spawn::die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("starting a sweep child process", e))?;
    let mut stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    // stderr is forwarded line by line by its own thread, so this one can watch the clock.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut tail = VecDeque::new();
    let mut timed_out = false;
    let status = loop {
        while let Ok(line) = rx.try_recv() {
            bar.suspend(|| eprintln!("  | {line}"));
            tail.push_back(line);
            if tail.len() > 20 {
                tail.pop_front();
            }
        }
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io("waiting for a sweep child", e))?
        {
            break status;
        }
        if opts.run_timeout.is_some_and(|t| start.elapsed() > t) && !timed_out {
            // SIGKILL: a run stuck in a CUDA kernel does not answer anything gentler.
            let _ = child.kill();
            timed_out = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = err_thread.join();
    for line in rx.try_iter() {
        bar.suspend(|| eprintln!("  | {line}"));
        tail.push_back(line);
    }
    let _ = out_thread.join();
    let tail: Vec<String> = tail.into_iter().rev().take(20).rev().collect();
    Ok((status, tail, timed_out))
}

fn fold_repeats(config: &SweepConfig, runs: &[&SweepRun], dir: &Path) -> SweepRepeats {
    let ok: Vec<&&SweepRun> = runs.iter().filter(|r| r.status == RunStatus::Ok).collect();
    // tokens/s is read back from the run logs; the sweep record keeps samples/s and p50 only.
    let tokens: Vec<f64> = ok
        .iter()
        .flat_map(|r| r.logs.iter())
        .filter_map(|l| read_log(&dir.join(l)).ok())
        .flat_map(|recs| {
            recs.into_iter()
                .filter_map(|r| RunEnd::of(&r).map(|e| e.tokens_per_second))
        })
        .collect();
    let pick =
        |f: fn(&SweepRun) -> Option<f64>| -> Vec<f64> { ok.iter().filter_map(|r| f(r)).collect() };
    SweepRepeats {
        config: config.clone(),
        n_repeats: runs.len(),
        n_ok: ok.len(),
        samples_per_second: spread(&pick(|r| r.samples_per_second)),
        tokens_per_second: spread(&tokens),
        latency_ms_p50: spread(&pick(|r| r.latency_ms_p50)),
    }
}

/// The runs an earlier invocation of this sweep finished (`ok` or `oom`: `--resume` skips
/// them); logs of children that died with it (kill -9) get a summary, so every log reads as
/// finished.
fn earlier_runs(dir: &Path, earlier: &[Record]) -> Result<Vec<SweepRun>> {
    let done = earlier
        .iter()
        .filter_map(|r| match r {
            Record::SweepRun(r) if r.status.is_done() => Some((**r).clone()),
            _ => None,
        })
        .collect();
    // No run record points at an orphan's log and it has no summary.
    let referenced: BTreeSet<String> = earlier
        .iter()
        .filter_map(|r| match r {
            Record::SweepRun(r) => Some(r.logs.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    for orphan in run_logs(dir)?.difference(&referenced) {
        complete_log(
            &dir.join(orphan),
            "the sweep was killed during this run",
            Some(RunStatus::Killed),
        )?;
    }
    Ok(done)
}

/// Opens (or continues) `sweep.jsonl` and writes this invocation's header.
fn open_sweep_log(opts: &SweepOptions, dir: &Path, resumed: bool) -> Result<RunLog> {
    let sweep_log = dir.join(SWEEP_LOG);
    let mut log = if sweep_log.is_file() {
        RunLog::append(&sweep_log)?
    } else {
        RunLog::create(dir, SWEEP_LOG.trim_end_matches(".jsonl"))?
    };
    log.write(&Record::SweepHeader(Box::new(SweepHeader {
        schema_version: SCHEMA_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: crate::GIT_COMMIT.into(),
        time_utc: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command_line: opts.command_line.clone(),
        suite: opts.suite.clone(),
        device: opts.device.clone(),
        resumed,
        repeat: opts.repeat,
        configs: opts.configs.clone(),
    })))?;
    Ok(log)
}

/// Runs one child for `config`, repeat `repeat`, and says how it ended: its status from the
/// exit and its stderr, its logs completed if it died, `timeout` if it was killed for
/// `--run-timeout`, `oom` if it recorded an out-of-memory before hanging.
fn run_one(
    opts: &SweepOptions,
    dir: &Path,
    config: &SweepConfig,
    repeat: usize,
    bar: &ProgressBar,
) -> Result<SweepRun> {
    let task = ChildTask {
        config: config.clone(),
        repeat,
        log_dir: dir.to_path_buf(),
    };
    let before = run_logs(dir)?;
    let start = Instant::now();
    let (exit, tail, timed_out) = run_child(opts, &task, bar)?;
    let (mut status, mut error) = classify(exit, &tail);
    if timed_out {
        let limit = opts.run_timeout.unwrap_or_default().as_secs_f64();
        status = RunStatus::Timeout;
        error = Some(format!("killed after --run-timeout {limit} s"));
    }
    let new_logs: Vec<String> = run_logs(dir)?.difference(&before).cloned().collect();
    let mut summary = None;
    for l in &new_logs {
        let failure = error
            .as_deref()
            .unwrap_or("the run ended without a summary");
        let killed_as = [RunStatus::Killed, RunStatus::Timeout]
            .into_iter()
            .find(|k| *k == status);
        if let Some(s) = complete_log(&dir.join(l), failure, killed_as.clone())? {
            summary.get_or_insert(s);
        }
    }
    if status == RunStatus::Ok && summary.is_none() {
        status = RunStatus::Error;
    }
    // A run that recorded its own out-of-memory and then hung on exit (seen with CUDA) ran out
    // of memory: that is the result, the kill only ended the hang.
    if let Some(s) = summary
        .as_ref()
        .filter(|s| s.status == RunStatus::Oom && status != RunStatus::Ok)
    {
        let then = error.take().unwrap_or_default();
        error = Some(format!(
            "{}; then did not exit ({then})",
            s.error.as_deref().unwrap_or("out of memory")
        ));
        status = RunStatus::Oom;
    }
    Ok(SweepRun {
        config: config.clone(),
        repeat,
        status,
        error,
        exit_code: exit.code(),
        wall_seconds: start.elapsed().as_secs_f64(),
        logs: new_logs,
        samples_per_second: summary.as_ref().map(|s| s.samples_per_second),
        latency_ms_p50: summary.as_ref().map(|s| s.latency_ms_p50),
    })
}

/// Runs the sweep; see the module docs.
pub fn run_sweep(opts: SweepOptions) -> Result<SweepOutcome> {
    let dir = sweep_dir(&opts)?;
    let sweep_log = dir.join(SWEEP_LOG);
    let earlier = if sweep_log.is_file() {
        read_log(&sweep_log)?
    } else {
        vec![]
    };
    let mut done = earlier_runs(&dir, &earlier)?;
    let mut log = open_sweep_log(&opts, &dir, !earlier.is_empty())?;
    let total = opts.configs.len() * opts.repeat;
    let bar = crate::progress::sweep_runs(opts.progress, total as u64);
    let (mut runs, mut repeats, mut skipped, mut n) = (vec![], vec![], 0, 0);
    for config in &opts.configs {
        let mut ran_any = false;
        for repeat in 0..opts.repeat {
            n += 1;
            bar.inc(1);
            if done
                .iter()
                .any(|r| r.config == *config && r.repeat == repeat)
            {
                skipped += 1;
                continue;
            }
            ran_any = true;
            bar.set_message(format!("{} r{repeat}", config.key()));
            let run = match oom_at_a_smaller_batch(config, &done) {
                Some(b) => not_run_after_oom(config, repeat, b),
                None => run_one(&opts, &dir, config, repeat, &bar)?,
            };
            log.write(&Record::SweepRun(Box::new(run.clone())))?;
            bar.suspend(|| eprintln!("[{n}/{total}] {}", run.line()));
            if run.status.is_done() {
                done.push(run.clone());
            }
            runs.push(run);
        }
        if ran_any && opts.repeat > 1 {
            let mine: Vec<&SweepRun> = done.iter().filter(|r| r.config == *config).collect();
            let folded = fold_repeats(config, &mine, &dir);
            log.write(&Record::SweepRepeats(Box::new(folded.clone())))?;
            repeats.push(folded);
        }
    }
    bar.finish_and_clear();
    Ok(SweepOutcome {
        dir,
        runs,
        repeats,
        skipped,
    })
}

/// The batch size at which this configuration, the batch aside, already ran out of memory, if
/// one below `config`'s did: a larger batch needs more memory, so it is not run (a sweep's
/// `--batch-sizes` doubling until out of memory costs one failed run, not one a size).
fn oom_at_a_smaller_batch(config: &SweepConfig, done: &[SweepRun]) -> Option<usize> {
    done.iter()
        .filter(|r| r.status == RunStatus::Oom && r.config.batch_size < config.batch_size)
        .filter(|r| {
            SweepConfig {
                batch_size: config.batch_size,
                ..r.config.clone()
            } == *config
        })
        .map(|r| r.config.batch_size)
        .min()
}

/// The record of a configuration left out because batch `smaller` ran out of memory.
fn not_run_after_oom(config: &SweepConfig, repeat: usize, smaller: usize) -> SweepRun {
    SweepRun {
        config: config.clone(),
        repeat,
        status: RunStatus::Oom,
        error: Some(format!(
            "not run: batch {smaller} of this configuration ran out of memory"
        )),
        exit_code: None,
        wall_seconds: 0.,
        logs: vec![],
        samples_per_second: None,
        latency_ms_p50: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(model: &str, batch_size: usize, zero: Option<u8>) -> SweepConfig {
        SweepConfig {
            model: model.into(),
            dtype: "bf16".into(),
            batch_size,
            seq_len: None,
            engine: "candle".into(),
            new_tokens: None,
            zero,
            recompute: None,
            request_rate: None,
        }
    }

    #[test]
    fn a_larger_batch_of_a_configuration_that_ran_out_of_memory_is_not_run() {
        let oom = SweepRun {
            status: RunStatus::Oom,
            ..not_run_after_oom(&config("gpt2-xl", 8, Some(0)), 0, 4)
        };
        let done = [oom];
        let at = |c: &SweepConfig| oom_at_a_smaller_batch(c, &done);
        assert_eq!(at(&config("gpt2-xl", 16, Some(0))), Some(8));
        assert_eq!(at(&config("gpt2-xl", 8, Some(0))), None, "the run itself");
        assert_eq!(at(&config("gpt2-xl", 4, Some(0))), None, "smaller");
        assert_eq!(
            at(&config("gpt2-xl", 16, Some(3))),
            None,
            "another strategy"
        );
        assert_eq!(at(&config("gpt2", 16, Some(0))), None, "another model");
        let skipped = not_run_after_oom(&config("gpt2-xl", 16, Some(0)), 0, 8);
        assert_eq!(skipped.status, RunStatus::Oom);
        assert!(skipped.error.unwrap().contains("batch 8"));
    }
}
