//! Helpers of the `bench` command-line tests (`tests/cli*.rs`): running the binary, reading its
//! errors, logs and summaries, and the stand-in HF worker (no torch).

// Each test file uses its own subset.
#[allow(unused_imports)]
pub use std::path::{Path, PathBuf};
#[allow(unused_imports)]
pub use std::process::{Command, Output};
#[allow(unused_imports)]
pub use transformer_bench::log::read_log;
#[allow(unused_imports)]
pub use transformer_bench::record::Record;

pub fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .output()
        .expect("bench runs")
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The error of a failed run: stderr's last line, and its only error line. Lines before it
/// say what the run was doing when it failed (loading weights, starting the HF worker).
pub fn error_line(err: &str) -> String {
    let lines: Vec<&str> = err.trim_end().lines().collect();
    let last = lines.last().copied().unwrap_or_default();
    assert!(last.starts_with("Error: "), "error not printed last: {err}");
    let errors = lines.iter().filter(|l| l.contains("Error")).count();
    assert_eq!(errors, 1, "error not printed once, on one line: {err}");
    last.to_string()
}

/// Runs bench expecting failure; returns its (one-line) error.
pub fn error_of(args: &[&str]) -> String {
    let o = bench(args);
    assert!(!o.status.success(), "bench {args:?} should fail");
    error_line(&stderr(&o))
}

pub fn log_path_from(stdout: &str) -> PathBuf {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("log: "))
        .expect("log path printed");
    PathBuf::from(&line[5..])
}

pub fn summary_of(args: &[&str]) -> Box<transformer_bench::record::Summary> {
    let o = bench(args);
    assert!(o.status.success(), "{}", stderr(&o));
    match read_log(&log_path_from(&String::from_utf8(o.stdout).unwrap()))
        .unwrap()
        .pop()
    {
        Some(Record::Summary(s)) => s,
        _ => panic!("no summary"),
    }
}

pub fn fake_worker() -> String {
    fixture("fake_hf_worker.py").to_str().unwrap().to_string()
}

pub fn bench_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("bench runs")
}

pub fn log_paths(stdout: &str) -> Vec<PathBuf> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("log: "))
        .map(PathBuf::from)
        .collect()
}

/// `--suite wikitext2` on the built-in sample, tiny blocks, with the stand-in HF worker.
pub fn wikitext2_hf(engine: &str, log_dir: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let worker = fake_worker();
    let model = fixture("gpt2-fixture");
    let mut args = vec![
        "--suite",
        "wikitext2",
        "--engine",
        engine,
        "--hf-worker",
        &worker,
        "--model-dir",
        model.to_str().unwrap(),
        "--batch-size",
        "2",
        "--block-size",
        "32",
        "--max-steps",
        "4",
        "--warmup",
        "1",
        "--log-dir",
        log_dir,
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    bench_env(&args, env)
}

pub fn steps_of(records: &[Record]) -> Vec<&transformer_bench::record::StepRecord> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// `bench`'s arguments for the stand-in HF worker on the gpt2 fixture, logging into `dir`,
/// then `extra`.
pub fn fake_hf_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let (worker, model) = (fake_worker(), fixture("gpt2-fixture"));
    let base = ["--engine", "hf", "--hf-worker", &worker, "--model-dir"];
    let mut args: Vec<String> = base.iter().map(|a| a.to_string()).collect();
    args.push(model.to_str().unwrap().into());
    args.extend(["--log-dir".into(), dir.to_str().unwrap().into()]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// The stand-in HF worker on the gpt2 fixture with `extra` flags and `env`, logging into `dir`:
/// the log's records and the console.
pub fn fake_hf_run(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Vec<Record>, String) {
    let args = fake_hf_args(dir, extra);
    let o = bench_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), env);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let log = log_paths(&stdout).pop().unwrap();
    (read_log(&log).unwrap(), stdout)
}
