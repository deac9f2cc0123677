#![cfg(feature = "report")]
//! The fuzzer's corpus in `cargo test` (#38): every seed of every target, a fixed-seed batch
//! of mutations, and every input under `tests/fixtures/fuzz/TARGET/` (the crashes found so
//! far are kept there) must parse or fail with an error, never panic. The long runs are
//! `cargo run --release --example fuzz -- TARGET SECONDS` (docs/testing.md).

use std::path::Path;
use transformer_bench::fuzz::{mutate, run_caught, Rng, Target, TARGETS};

/// Mutations per target: enough to touch every edit kind, cheap enough for CI (< 1 s).
const MUTATIONS: usize = 300;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_target_has_seeds() {
    for target in TARGETS {
        assert!(
            !target.seed_files(root()).is_empty(),
            "{}: no seed files (moved fixtures?)",
            target.name()
        );
    }
    assert!(Target::Logs
        .seed_files(root())
        .iter()
        .any(|p| p.to_string_lossy().ends_with(".jsonl.gz")));
}

#[test]
fn seeds_and_fixed_mutations_do_not_panic() {
    for target in TARGETS {
        let seeds = target.seeds(root());
        for (i, seed) in seeds.iter().enumerate() {
            if let Err(msg) = run_caught(target, seed) {
                panic!("{}: seed {i} panicked: {msg}", target.name());
            }
        }
        let mut rng = Rng::new(0x38);
        for i in 0..MUTATIONS {
            let input = mutate(&mut rng, &seeds);
            if let Err(msg) = run_caught(target, &input) {
                panic!(
                    "{}: mutation {i} panicked: {msg}\ninput: {:?}",
                    target.name(),
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }
}

/// The rows and skipped-line count of the fixture `tests/fixtures/fuzz/logs/NAME` as `format`.
fn parse_fuzz_log(
    name: &str,
    format: transformer_bench::report::extract::formats::Format,
) -> (Vec<transformer_bench::report::extract::RunRow>, usize) {
    let path = root().join("tests/fixtures/fuzz/logs").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    transformer_bench::report::extract::formats::parse(format, &path, &text)
}

/// `s:9223372036854775807 trl:…` in an llm.c `main.log`: `step + 1` overflowed (a panic with
/// overflow checks, a wrapped step count without). The count saturates.
#[test]
fn llmc_main_log_step_at_i64_max() {
    use transformer_bench::report::extract::formats::Format;
    let (rows, skipped) = parse_fuzz_log("main_step_i64_max.log", Format::LlmcMainLog);
    assert_eq!(skipped, 0);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].cell("n_steps").as_deref(),
        Some("9223372036854775807")
    );
    assert_eq!(rows[0].cell("train_loss_last").as_deref(), Some("1"));
}

/// `step 18446744073709551615: train loss …` of llm.c's C trainer (0-based steps): its 1-based
/// count `step + 1` overflowed. Such a line is no step line: skipped, not a step of 0.
#[test]
fn llmc_c_step_at_usize_max() {
    use transformer_bench::report::extract::formats::Format;
    let (rows, skipped) = parse_fuzz_log("c_step_usize_max.log", Format::LlmcLog);
    assert!(rows.is_empty(), "{rows:?}");
    assert_eq!(skipped, 2);
}
