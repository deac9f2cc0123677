//! Helpers the multi-process tests share: a `bench` command with no launcher variables
//! inherited from the test's environment, and readers of its output and logs; [`cli`] and
//! [`extract`] hold the helpers of the command-line tests (`cli*.rs`; `extract_*.rs`,
//! `plot_cli.rs`).

#![allow(dead_code)] // each test file uses its own subset

pub mod cli;
#[cfg(feature = "report")]
pub mod extract;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `bench`, piped, without torchrun / test-hook variables from the environment.
pub fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env_remove("BENCH_DIST_CHECK_DIE");
    for k in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        c.env_remove(k);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// [`bench`] writing its logs to `log_dir`, without a progress bar.
pub fn bench_logging_to(log_dir: &Path) -> Command {
    let mut c = bench();
    c.arg("--no-progress").arg("--log-dir").arg(log_dir);
    c
}

/// stdout then stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The records of a JSONL run log.
pub fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The finished records of a JSONL run log that may still be written, or was killed mid-write:
/// a last line without its newline is skipped (a reader can see a write half-done), as the
/// product's `read_log` does; a bad line anywhere else still fails.
pub fn finished_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let finished = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    finished
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The one file a run wrote into `dir` (its log).
pub fn only_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}
