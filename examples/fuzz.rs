//! Fuzzes one parser target for a duration (stable Rust; see `transformer_bench::fuzz`):
//!
//! `cargo run --release --example fuzz -- logs|suite|lambada SECONDS [SEED]`
//!
//! Mutates the shipped fixtures, feeds each input to the target inside `catch_unwind`, and on a
//! panic writes the input to `fuzz-crash-TARGET-N.bin` and exits 1. Prints the executions.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use transformer_bench::fuzz::{mutate, run_caught, Rng, Target, TARGETS};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<_> = TARGETS.iter().map(|t| t.name()).collect();
    let usage = format!("usage: fuzz {} SECONDS [SEED]", names.join("|"));
    let (Some(target), Some(secs)) = (
        args.first().and_then(|a| Target::from_name(a)),
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
    ) else {
        eprintln!("Error: {usage}");
        return ExitCode::FAILURE;
    };
    let seed = args
        .get(2)
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0x5eed_f022);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let seeds = target.seeds(root);
    if seeds.is_empty() {
        eprintln!(
            "Error: no seed files for {} under {}",
            target.name(),
            root.display()
        );
        return ExitCode::FAILURE;
    }
    // The default hook prints every caught panic; keep its location for the report instead.
    let last = Arc::new(Mutex::new(String::new()));
    let hook_last = last.clone();
    std::panic::set_hook(Box::new(move |info| {
        if let Ok(mut l) = hook_last.lock() {
            *l = info.to_string();
        }
    }));

    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut report = start;
    let mut execs: u64 = 0;
    // Every seed as is, then mutations until the deadline.
    let mut queue = seeds.clone().into_iter();
    while Instant::now() < deadline {
        let input = queue.next().unwrap_or_else(|| mutate(&mut rng, &seeds));
        execs += 1;
        if let Err(msg) = run_caught(target, &input) {
            let crash = format!("fuzz-crash-{}-{execs}.bin", target.name());
            let _ = std::fs::write(&crash, &input);
            let at = last.lock().map(|l| l.clone()).unwrap_or_default();
            eprintln!(
                "PANIC in {} after {execs} executions: {msg}\n  {at}\n  input written to {crash} ({} bytes)",
                target.name(),
                input.len()
            );
            return ExitCode::FAILURE;
        }
        if report.elapsed() >= Duration::from_secs(60) {
            report = Instant::now();
            eprintln!(
                "{}: {execs} executions in {:.0} s",
                target.name(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}: {execs} executions in {secs:.0} s ({:.0}/s) from {} seeds (rng seed {seed:#x}), no panic",
        target.name(),
        execs as f64 / secs,
        seeds.len()
    );
    ExitCode::SUCCESS
}
