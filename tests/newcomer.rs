//! A newcomer's first contact: `--device auto` and `--dtype auto` are the defaults, say what
//! they chose and why, and the log records it.

mod common;

use common::{bench, bench_logging_to, records, text};

#[test]
fn help_shows_device_and_dtype_default_to_auto() {
    let o = bench().arg("--help").output().unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    let device = help
        .split("--device <DEVICE>")
        .nth(1)
        .expect("--device in --help");
    assert!(
        device[..400.min(device.len())].contains("[default: auto]"),
        "{help}"
    );
    let dtype = help
        .split("--dtype <DTYPES>")
        .nth(1)
        .expect("--dtype in --help");
    assert!(
        dtype[..600.min(dtype.len())].contains("[default: auto]"),
        "{help}"
    );
}

#[test]
fn auto_on_a_cpu_build_runs_fp32_on_the_cpu_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args(["--limit", "8"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // This test binary is a CPU build (CI): auto must say so, and how to get GPUs.
    assert!(
        out.contains("auto: cpu, fp32 (this build has no CUDA"),
        "{out}"
    );
    let log = out.lines().find_map(|l| l.strip_prefix("log: ")).unwrap();
    let header = &records(std::path::Path::new(log))[0];
    assert_eq!(header["device"], "cpu");
    assert_eq!(header["dtype"], "fp32");
    assert!(header["auto"].as_str().unwrap().contains("--features cuda"));
}

#[test]
fn an_explicit_device_and_dtype_are_not_auto() {
    let dir = tempfile::tempdir().unwrap();
    let o = bench_logging_to(dir.path())
        .args(["--limit", "8", "--device", "cpu", "--dtype", "fp32"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("auto:"), "{out}");
}

#[test]
fn a_bad_device_names_auto_among_the_choices() {
    let o = bench().args(["--device", "tpu"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("use auto, cpu, cuda or cuda:N"), "{err}");
}

/// An HF hub cache as `huggingface_hub` lays it out, made from `--save-weights`:
/// `models--org--tiny/snapshots/REV/` and `refs/main` holding REV.
fn hub_cache(root: &std::path::Path) -> std::path::PathBuf {
    let repo = root.join("models--org--tiny");
    let snapshot = repo.join("snapshots/0123456789abcdef");
    let o = bench()
        .args(["--model", "gpt2-tiny", "--limit", "1", "--no-progress"])
        .arg("--log-dir")
        .arg(root.join("logs"))
        .arg("--save-weights")
        .arg(&snapshot)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123456789abcdef").unwrap();
    root.to_path_buf()
}

#[test]
fn a_hub_id_runs_offline_from_the_hf_cache_and_a_missing_one_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cache = hub_cache(dir.path());
    let run = |model: &str| {
        bench_logging_to(&dir.path().join("runs"))
            .env("HF_HUB_CACHE", &cache)
            .env("HF_HUB_OFFLINE", "1")
            .args(["--model", model, "--limit", "8"])
            .output()
            .unwrap()
    };
    let o = run("org/tiny");
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("org/tiny"), "{out}");
    let log = out.lines().find_map(|l| l.strip_prefix("log: ")).unwrap();
    assert!(log.contains("org--tiny"), "the id names no folder: {log}");
    let header = &records(std::path::Path::new(log))[0];
    assert!(header["model"]["weights"]
        .as_str()
        .unwrap()
        .contains("0123456789abcdef"));
    let missing = run("org/nothing");
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("org/nothing") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
}
