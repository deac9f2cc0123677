#![cfg(feature = "report")]
//! Sweeps as users run them: a matrix in one command, an out-of-memory in one configuration
//! recorded while the sweep goes on, `kill -9` of a running sweep losing nothing, `--resume`
//! finishing it, and extract-metrics reading the result.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use transformer_bench::log::read_log;
use transformer_bench::record::{Record, SweepRun};

const BENCH: &str = env!("CARGO_BIN_EXE_bench");

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn only_dir(parent: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "one sweep directory: {dirs:?}");
    dirs[0].clone()
}

fn sweep_runs(dir: &Path) -> Vec<SweepRun> {
    read_log(&dir.join("sweep.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::SweepRun(r) => Some(*r),
            _ => None,
        })
        .collect()
}

/// extract-metrics over a sweep directory, as CSV lines.
fn extract(dir: &Path) -> Vec<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_extract-metrics"))
        .args(["-i", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn column<'a>(csv: &'a [String], name: &str) -> Vec<&'a str> {
    let i = csv[0].split(',').position(|c| c == name).expect(name);
    csv[1..]
        .iter()
        .map(|l| l.split(',').nth(i).unwrap())
        .collect()
}

#[test]
fn a_matrix_from_a_suite_file_runs_every_config_and_folds_repeats() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = tmp.path().join("matrix.toml");
    let base =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("suites/lambada.toml"))
            .unwrap();
    std::fs::write(
        &suite,
        format!("{base}\n[sweep]\nmodels = [\"gpt2-tiny\", \"bloom-tiny\"]\nbatch_sizes = [4, 8]\nrepeat = 2\n"),
    )
    .unwrap();
    let logs = tmp.path().join("logs");
    let o = Command::new(BENCH)
        .args(["--suite-file", suite.to_str().unwrap(), "--limit", "16"])
        .args(["--batch-sizes", "8", "--log-dir", logs.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let dir = only_dir(&logs);
    let runs = sweep_runs(&dir);
    // The flag replaced the file's batch sizes; the file's models and repeats stay.
    let got: BTreeSet<(String, usize, usize)> = runs
        .iter()
        .map(|r| (r.config.model.clone(), r.config.batch_size, r.repeat))
        .collect();
    let want: BTreeSet<_> = ["gpt2-tiny", "bloom-tiny"]
        .iter()
        .flat_map(|m| (0..2).map(move |r| (m.to_string(), 8, r)))
        .collect();
    assert_eq!(got, want);
    assert!(runs.iter().all(|r| r.status == "ok" && r.logs.len() == 1));
    let folded: Vec<_> = read_log(&dir.join("sweep.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::SweepRepeats(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(folded.len(), 2);
    for f in &folded {
        let s = f.samples_per_second.as_ref().unwrap();
        assert_eq!((f.n_repeats, f.n_ok), (2, 2));
        assert!(s.min <= s.median && s.median <= s.max && s.cv >= 0.);
    }
    // Each run's log carries its repeat index; extract-metrics gives one row a run.
    let csv = extract(&dir);
    assert_eq!(csv.len(), 1 + 4, "{csv:?}");
    let mut repeats = column(&csv, "repeat");
    repeats.sort();
    assert_eq!(repeats, ["0", "0", "1", "1"]); // integers are written as integers
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("cv %") && stdout.contains("4 ok"),
        "{stdout}"
    );
}

#[test]
fn out_of_memory_in_one_config_is_recorded_and_the_sweep_goes_on() {
    // A real out-of-memory: a 1.5 GB address-space limit that gpt2-large's 3 GB of fp32 weights
    // cannot fit in (the host's analogue of CUDA_ERROR_OUT_OF_MEMORY). The child aborts; the
    // sweep records it and runs the next configuration.
    let tmp = tempfile::tempdir().unwrap();
    let cmd = format!(
        "ulimit -v 1500000; exec {BENCH} --models gpt2-tiny,gpt2-large,bloom-tiny --limit 8 --log-dir {}",
        tmp.path().display()
    );
    let o = Command::new("sh").args(["-c", &cmd]).output().unwrap();
    assert!(
        o.status.success(),
        "an oom is a result, not a failure: {}",
        stderr(&o)
    );
    let dir = only_dir(tmp.path());
    let runs = sweep_runs(&dir);
    let status: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| (r.config.model.as_str(), r.status.as_str()))
        .collect();
    assert_eq!(
        status,
        [
            ("gpt2-tiny", "ok"),
            ("gpt2-large", "oom"),
            ("bloom-tiny", "ok")
        ]
    );
    let oom = &runs[1];
    assert!(
        oom.error.as_ref().unwrap().contains("memory allocation of"),
        "{:?}",
        oom.error
    );
    // The oom run wrote no log of its own: its row comes from the sweep log.
    assert!(oom.logs.is_empty());
    let csv = extract(&dir);
    let mut rows: Vec<(&str, &str)> = column(&csv, "model")
        .into_iter()
        .zip(column(&csv, "status"))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("bloom-tiny", "ok"),
            ("gpt2-large", "oom"),
            ("gpt2-tiny", "ok")
        ]
    );
}

/// Processes whose command line names `needle` (the sweep's private log dir).
fn processes_naming(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// The sweep's directory under `logs` once its sweep.jsonl records `n` runs.
fn sweep_dir_with_runs(logs: &Path, n: usize) -> PathBuf {
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < Duration::from_secs(120), "sweep too slow");
        std::thread::sleep(Duration::from_millis(20));
        let Ok(mut d) = std::fs::read_dir(logs) else {
            continue;
        };
        let Some(Ok(dir)) = d.next() else { continue };
        let text = std::fs::read_to_string(dir.path().join("sweep.jsonl")).unwrap_or_default();
        if text.matches("\"record\":\"sweep_run\"").count() >= n {
            return dir.path();
        }
    }
}

/// Waits (up to 10 s) until no process names `needle`: the children die with the sweep
/// (PR_SET_PDEATHSIG).
fn no_process_names(needle: &str) {
    let start = Instant::now();
    while !processes_naming(needle).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "children outlived the sweep"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kill_dash_nine_loses_nothing_and_resume_finishes_the_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let logs_s = logs.to_str().unwrap().to_string();
    let args = [
        "--models",
        "gpt2-tiny",
        "--batch-sizes",
        "1,2,4,8",
        "--repeat",
        "3",
        "--limit",
        "48",
        "--log-dir",
        &logs_s,
    ];
    let mut sweep = Command::new(BENCH)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it -9 once three runs are recorded, with the fourth child running.
    let dir = sweep_dir_with_runs(&logs, 3);
    sweep.kill().unwrap(); // SIGKILL
    sweep.wait().unwrap();
    no_process_names(&logs_s);
    // Every log reads back: records whole, at most a torn last line skipped.
    let before = sweep_runs(&dir);
    assert!(before.len() >= 3 && before.len() < 12, "{}", before.len());
    for entry in std::fs::read_dir(&dir).unwrap() {
        read_log(&entry.unwrap().path()).unwrap();
    }
    assert!(extract(&dir).len() > 3);

    // --resume runs only what is missing.
    let o = Command::new(BENCH)
        .args(args)
        .arg("--resume")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let after = sweep_runs(&dir);
    assert_eq!(after.len(), 12, "each run recorded once: {after:?}");
    let done: BTreeSet<(usize, usize)> = after
        .iter()
        .filter(|r| r.status == "ok")
        .map(|r| (r.config.batch_size, r.repeat))
        .collect();
    assert_eq!(done.len(), 12);
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "finished runs not redone"
    );
    // The child killed with the sweep (if one was mid-run) has its log completed as `killed`.
    let mut statuses = vec![];
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == "sweep.jsonl" {
            continue;
        }
        let records = read_log(&path).unwrap();
        match records.last() {
            Some(Record::Summary(s)) => statuses.push(s.status.clone()),
            _ => panic!("{} has no summary after --resume", path.display()),
        }
    }
    assert_eq!(statuses.iter().filter(|s| *s == "ok").count(), 12);
    assert!(statuses.iter().all(|s| s == "ok" || s == "killed"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!("{} done earlier and skipped", before.len())),
        "{stdout}"
    );
}

#[test]
fn a_typo_in_the_matrix_fails_before_any_run() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(BENCH)
        .args(["--models", "gpt2-tiny,gpt9", "--log-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.starts_with("Error: unknown model 'gpt9'") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    let o = Command::new(BENCH)
        .args(["--resume", "--log-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(stderr(&o).contains("run the sweep without --resume first"));
}

#[test]
fn a_run_past_run_timeout_is_killed_and_recorded() {
    // gpt2-xl's 1.5 B random weights and its forward take far longer than 10 s on CPU;
    // gpt2-tiny's whole run well under it, on a loaded 2-core machine too.
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(BENCH)
        .args([
            "--models",
            "gpt2-xl,gpt2-tiny",
            "--limit",
            "8",
            "--run-timeout",
            "10",
        ])
        .args(["--no-progress", "--log-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "a timeout fails the sweep");
    let runs = sweep_runs(&only_dir(tmp.path()));
    let status: Vec<&str> = runs.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(status, ["timeout", "ok"]);
    assert!(runs[0].error.as_ref().unwrap().contains("--run-timeout 10"));
    assert!(runs[0].wall_seconds < 30.);
}
