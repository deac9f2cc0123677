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
