//! The training suite's engines side by side, on the CPU: `--engine llmc` end to end with a
//! stand-in for llm.c's `train_gpt2cu` (a shell script that records its arguments, copies the
//! token files it was given and prints llm.c's own lines: the step line format of
//! `tests/fixtures/logs/llmc/train_gpt2cu.log`, llm.c's `printf` in train_gpt2.cu), and
//! `--hf-compile` in a training sweep with the stand-in HF worker.

mod common;

use common::{bench_logging_to, text};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use transformer_bench::log::read_log;
use transformer_bench::record::{Header, Record, StepRecord, TrainSummary};
use transformer_bench::scenarios::train::data::{blocks, Splits};
use transformer_bench::tokenizer::TextTokenizer;

/// The stand-in. `$FAKE_LLMC_DIR` receives `args.txt`, `cwd.txt` and copies of the token files;
/// step i of N: loss 11 - i/10, lr 1e-3 (N - i + 1) / N, 1893.62 ms for the first step (llm.c's
/// warm-up), 300 + i ms after. `FAKE_LLMC_FAIL_AT=i`: a CUDA error on stderr and exit 3
/// instead of step i.
const FAKE_LLMC: &str = r#"#!/bin/sh
set -e
echo "$@" > "$FAKE_LLMC_DIR/args.txt"
pwd > "$FAKE_LLMC_DIR/cwd.txt"
while [ $# -gt 0 ]; do
  case "$1" in
    -i) train=$2 ;; -j) val=$2 ;; -x) steps=$2 ;; -o) out=$2 ;;
  esac
  shift 2
done
cp "$train" "$FAKE_LLMC_DIR/train.bin"
cp "$val" "$FAKE_LLMC_DIR/val.bin"
mkdir -p "$out"
echo "+-----------------------+----------------------------------------------------+"
echo "| num_parameters        | 124475904                                          |"
echo "allocated 237 MiB for model parameters"
echo "device memory usage: 7843 MiB / 81090 MiB"
echo "val loss 11.009463"
i=1
while [ $i -le $steps ]; do
  if [ "$i" = "${FAKE_LLMC_FAIL_AT:-0}" ]; then
    echo "[CUDA ERROR] at file train_gpt2.cu:1234: an illegal memory access was encountered" >&2
    exit 3
  fi
  awk -v i=$i -v n=$steps 'BEGIN {
    ms = (i == 1) ? 1893.62 : 300 + i
    printf "step %4d/%d | loss %f (+nanz)| norm 15.4073 (+nanz)| lr %.2e | %.2f ms | 46.1%% bf16 MFU | 1678023 tok/s\n", i, n, 11 - i / 10, 1e-3 * (n - i + 1) / n, ms
  }'
  i=$((i + 1))
done
echo "val loss 10.402117"
echo "total average iteration time: 303.500000 ms"
"#;

/// The stand-in as an executable in `dir`.
fn fake_llmc(dir: &Path) -> PathBuf {
    let path = dir.join("train_gpt2cu");
    std::fs::write(&path, FAKE_LLMC).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `bench --suite wikitext2 --engine llmc` on the built-in sample: gpt2, batch 2 x block 64,
/// 5 steps of which 1 warm-up, lr 1e-3, bf16 on cuda:0 (no GPU is touched: the stand-in runs),
/// in `work`, naming the stand-in by a relative path (llm.c runs in a folder of its own).
fn run_llmc(work: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    fake_llmc(work);
    let mut c = bench_logging_to(&work.join("logs"));
    c.args([
        "--suite",
        "wikitext2",
        "--engine",
        "llmc",
        "--model",
        "gpt2",
    ])
    .args(["--dtype", "bf16", "--device", "cuda:0", "--batch-size", "2"])
    .args(["--block-size", "64", "--max-steps", "5", "--warmup", "1"])
    .args(["--lr", "1e-3", "--llmc-bin", "./train_gpt2cu"])
    .args(extra)
    .current_dir(work)
    .env("FAKE_LLMC_DIR", work)
    .env("TMPDIR", work)
    .env_remove("LLMC_BIN");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn only_log(dir: &Path) -> Vec<Record> {
    let logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    read_log(&logs[0]).unwrap()
}

fn parts(records: &[Record]) -> (&Header, Vec<&StepRecord>, &TrainSummary) {
    let Record::Header(h) = &records[0] else {
        panic!("header first")
    };
    let steps = records
        .iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            _ => None,
        })
        .collect();
    let Some(Record::TrainSummary(s)) = records.last() else {
        panic!("train summary last")
    };
    (h, steps, s)
}

/// A token file's header (magic, version, count) and its ids.
fn read_token_file(path: &Path) -> ((i32, i32, i32), Vec<u32>) {
    let b = std::fs::read(path).unwrap();
    let int = |i: usize| i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
    assert!((3..256).all(|i| int(i) == 0), "header padding is zeros");
    let ids = b[1024..]
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
        .collect();
    ((int(0), int(1), int(2)), ids)
}

/// The suite's blocks of the built-in sample, as the tokenizer makes them, then llm.c's
/// closing `<|endoftext|>`.
fn expected_ids(text: &str) -> (usize, Vec<u32>) {
    let tok = TextTokenizer::for_model(None, "gpt2").unwrap();
    let b = blocks(text, &tok, 64).unwrap();
    let mut ids: Vec<u32> = b.iter().flatten().copied().collect();
    ids.push(50256);
    (b.len(), ids)
}

#[test]
fn llmc_gets_the_suites_tokens_and_its_steps_become_the_run_log() {
    let work = tempfile::tempdir().unwrap();
    let o = run_llmc(work.path(), &[], &[]);
    assert!(o.status.success(), "{}", text(&o));

    // The token files llm.c was given: header, then the suite's blocks.
    let splits = Splits::sample();
    let (n_train, train_ids) = expected_ids(&splits.train.text);
    let (n_eval, val_ids) = expected_ids(&splits.eval.text);
    let (header, ids) = read_token_file(&work.path().join("train.bin"));
    assert_eq!(header, (20240520, 1, train_ids.len() as i32));
    assert_eq!(ids, train_ids);
    let (header, ids) = read_token_file(&work.path().join("val.bin"));
    assert_eq!(header, (20240520, 1, val_ids.len() as i32));
    assert_eq!(ids, val_ids);

    // Its arguments: the suite's shape and schedule.
    let args = std::fs::read_to_string(work.path().join("args.txt")).unwrap();
    let want = format!(
        "-e d12 -b 2 -t 64 -d 128 -x 5 -l 0.001 -k linear -u 0 -q 0.0 -c 0 -v 6 -m {} -s 0 -h 0 -n 0 -y 0 -r 0",
        n_eval / 2
    );
    assert!(args.contains(&want), "{args}");

    let records = only_log(&work.path().join("logs"));
    let (h, steps, s) = parts(&records);
    assert_eq!((h.engine.as_str(), h.dtype.as_str()), ("llmc", "bf16"));
    assert_eq!(h.train.as_ref().unwrap().n_train_blocks, n_train);
    assert!(h.train.as_ref().unwrap().timing.contains("llm.c"));
    // Dropout was asked (the config's; no --no-dropout), but llm.c has none: the header says
    // what was trained.
    assert!(!h.train.as_ref().unwrap().dropout);
    let workdir = PathBuf::from(&h.engine_info["workdir"]);
    let cwd = std::fs::read_to_string(work.path().join("cwd.txt")).unwrap();
    assert_eq!(Path::new(cwd.trim()), workdir);
    // Every step line, as printed: loss, lr, norm, llm.c's own time; 2 blocks of 64 tokens.
    let losses: Vec<f64> = steps.iter().map(|s| s.loss).collect();
    assert_eq!(losses, [10.9, 10.8, 10.7, 10.6, 10.5]);
    assert_eq!(steps[0].learning_rate, 1e-3);
    assert_eq!(steps[1].grad_norm, 15.4073);
    let ms: Vec<f64> = steps.iter().map(|s| s.latency_ms).collect();
    assert_eq!(ms, [1893.62, 302., 303., 304., 305.]);
    assert!(steps[0].warmup && steps[1..].iter().all(|s| !s.warmup));
    assert!(steps.iter().all(|s| (s.n_samples, s.n_tokens) == (2, 128)));

    // The summary: rates over the 4 timed steps, the warm-up step reported apart.
    assert_eq!((s.status.as_str(), s.n_steps, s.warmup_steps), ("ok", 5, 1));
    let timed_s = (302. + 303. + 304. + 305.) / 1e3;
    assert!((s.train_samples_per_second - 8. / timed_s).abs() < 1e-9);
    assert!((s.tokens_per_second - 512. / timed_s).abs() < 1e-6);
    assert_eq!(s.step_latency_ms_p50, 303.5);
    assert!((s.warmup_runtime.unwrap() - 1.89362).abs() < 1e-12);
    assert_eq!(s.eval_loss, 10.402117);
    assert!(
        s.eval_runtime.is_nan(),
        "llm.c does not time its evaluation"
    );
    assert_eq!(s.peak_memory_bytes, 7843 << 20);
    assert!((s.train_loss - 10.7).abs() < 1e-12);
    assert!(
        s.model_flops.unwrap() > 0. && s.mfu.is_none(),
        "no GPU here: no MFU"
    );

    // The console table names the engine; llm.c's output stays, its token files go.
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("llmc | wikitext2 | gpt2"), "{stdout}");
    assert!(stdout.contains("1 warm-up, not timed: 1.894 s"), "{stdout}");
    let output = std::fs::read_to_string(workdir.join("output.log")).unwrap();
    assert!(output.contains("step    5/5 |") && output.contains("total average"));
    assert!(!workdir.join("train.bin").exists() && !workdir.join("val.bin").exists());
}

#[test]
fn llmc_exiting_non_zero_names_its_status_and_last_lines_and_keeps_the_log() {
    let work = tempfile::tempdir().unwrap();
    let o = run_llmc(work.path(), &[], &[("FAKE_LLMC_FAIL_AT", "3")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let err = err.lines().find(|l| l.starts_with("Error: ")).unwrap();
    for want in [
        "llm.c ended (exit status: 3)",
        "after step 2 of 5",
        "[CUDA ERROR] at file train_gpt2.cu:1234: an illegal memory access",
        "output.log",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let records = only_log(&work.path().join("logs"));
    let (h, steps, s) = parts(&records);
    assert_eq!(steps.len(), 2);
    assert_eq!((s.status.as_str(), s.n_steps), ("error", 2));
    assert!(s.error.as_deref().unwrap().contains("exit status: 3"));
    // A failed run keeps its token files beside llm.c's output.
    let workdir = PathBuf::from(&h.engine_info["workdir"]);
    assert!(workdir.join("train.bin").exists() && workdir.join("output.log").exists());
}

/// Runs bench expecting a one-line error; returns it.
fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.starts_with("Error: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    err
}

#[test]
fn a_missing_binary_and_what_llmc_cannot_run_are_one_line_errors() {
    let work = tempfile::tempdir().unwrap();
    // `--engine llmc` with SUITE, MODEL, DTYPE, DEVICE, then `extra`.
    let run = |[suite, model, dtype, device]: [&str; 4], extra: &[&str], env: Option<&str>| {
        let mut c = bench_logging_to(&work.path().join("logs"));
        c.args(["--engine", "llmc", "--suite", suite, "--model", model])
            .args(["--dtype", dtype, "--device", device])
            .args(extra)
            .env_remove("LLMC_BIN");
        if let Some(v) = env {
            c.env("LLMC_BIN", v);
        }
        one_line_error(&c.output().unwrap())
    };
    let good = ["wikitext2", "gpt2", "bf16", "cuda:0"];
    let e = run(good, &[], None);
    for want in ["--llmc-bin", "LLMC_BIN", "/work/shared/gpu/llmc"] {
        assert!(e.contains(want), "{want}: {e}");
    }
    let e = run(good, &[], Some("/no/such/train_gpt2cu"));
    assert!(
        e.contains("LLMC_BIN /no/such/train_gpt2cu: not an executable"),
        "{e}"
    );
    let data = work.path().join("data.txt");
    std::fs::write(&data, "not a program").unwrap();
    let e = run(good, &["--llmc-bin", data.to_str().unwrap()], None);
    assert!(
        e.contains("--llmc-bin") && e.contains("not an executable"),
        "{e}"
    );

    let bin = fake_llmc(work.path());
    let with_bin = ["--llmc-bin", bin.to_str().unwrap()];
    let cases = [
        (
            ["wikitext2", "gpt2", "fp32", "cuda:0"],
            "bf16 only: use --dtype bf16, not fp32",
        ),
        (
            ["wikitext2", "bloom-560m", "bf16", "cuda:0"],
            "gpt2 (d12), gpt2-medium (d24)",
        ),
        (["wikitext2", "gpt2", "bf16", "cpu"], "use --device cuda:0"),
        (
            ["lambada", "gpt2", "bf16", "cuda:0"],
            "use it with --suite wikitext2",
        ),
    ];
    for (what, want) in cases {
        let e = run(what, &with_bin, None);
        assert!(e.contains(want), "{what:?}: {e}");
    }
    let e = run(good, &[&with_bin[..], &["--phase-times"]].concat(), None);
    assert!(e.contains("drop it for --engine llmc"), "{e}");
    let mut c = bench_logging_to(&work.path().join("logs"));
    c.args(["--suite", "wikitext2"]).args(with_bin);
    let e = one_line_error(&c.output().unwrap());
    assert!(e.contains("--llmc-bin is for --engine llmc"), "{e}");
    assert!(!work.path().join("logs").exists(), "nothing ran");
}

#[test]
fn a_training_sweep_prints_one_table_of_its_runs() {
    let work = tempfile::tempdir().unwrap();
    let o = run_llmc(work.path(), &["--repeat", "2"], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    // Both runs completed with their own training summaries (no LAMBADA summary appended).
    assert!(stdout.contains("sweep: 2 runs (2 ok"), "{stdout}");
    assert!(stdout.contains("ok, 6.59 samples/s"), "{stdout}");
    let table = &stdout[stdout.find("\ntraining").expect("training table")..];
    let row = |name: &str| -> Vec<String> {
        let line = table.lines().find(|l| l.starts_with(name)).unwrap();
        line[26..].split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(row("training"), ["llmc", "llmc"]);
    assert_eq!(row("train_samples_per_second"), ["6.59", "6.59"]);
    assert_eq!(row("peak memory MiB"), ["7843", "7843"]);
    assert_eq!(row("warm-up s (not timed)"), ["1.89", "1.89"]);
    assert_eq!(row("eval_loss"), ["10.4021", "10.4021"]);
    assert_eq!(row("samples/s / llmc"), ["1.000", "1.000"]);
    let sweep_dir = std::fs::read_dir(work.path().join("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    for log in std::fs::read_dir(&sweep_dir).unwrap() {
        let path = log.unwrap().path();
        if path.file_name().unwrap() == "sweep.jsonl" {
            continue;
        }
        let records = read_log(&path).unwrap();
        let summaries = records
            .iter()
            .filter(|r| matches!(r, Record::TrainSummary(_) | Record::Summary(_)));
        assert_eq!(summaries.count(), 1, "{}", path.display());
    }
}

#[test]
fn compiled_hf_is_its_own_column_and_its_compile_step_is_reported_not_timed() {
    let work = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut c = bench_logging_to(&work.path().join("logs"));
    c.args([
        "--suite",
        "wikitext2",
        "--engine",
        "candle,hf",
        "--hf-compile",
    ])
    .arg("--hf-worker")
    .arg(fixtures.join("fake_hf_worker.py"))
    .arg("--model-dir")
    .arg(fixtures.join("gpt2-fixture"))
    .args([
        "--batch-size",
        "2",
        "--block-size",
        "32",
        "--max-steps",
        "4",
    ])
    .args(["--warmup", "1"]);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let table = &stdout[stdout.find("\ntraining").expect("training table")..];
    let head: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(head, ["training", "candle", "hf-compile"]);
    // The stand-in's 5 ms a step: 1 warm-up step reported, 3 timed at 2 blocks each.
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .to_string()
    };
    assert!(row("warm-up s (not timed)").ends_with(" 0.01"), "{table}");
    assert!(
        row("train_samples_per_second").ends_with(" 400.00"),
        "{table}"
    );
    let sweep_dir = std::fs::read_dir(work.path().join("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    let hf_log = std::fs::read_dir(&sweep_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("_hf-compile_"))
        .expect("the log's name says hf-compile");
    let records = read_log(&hf_log).unwrap();
    let (h, _, s) = parts(&records);
    assert_eq!(h.engine_info["compile"], "true");
    assert!(h.train.as_ref().unwrap().timing.contains("torch.compile"));
    assert_eq!(s.warmup_runtime, Some(0.005));
    assert_eq!(s.n_steps - s.warmup_steps, 3);

    // Compilation lands in the first step: it must be a warm-up step.
    let mut c = bench_logging_to(&work.path().join("logs"));
    c.args([
        "--suite",
        "wikitext2",
        "--engine",
        "hf",
        "--hf-compile",
        "--warmup",
        "0",
    ]);
    let e = one_line_error(&c.output().unwrap());
    assert!(e.contains("keep --warmup at 1 or more"), "{e}");
}
