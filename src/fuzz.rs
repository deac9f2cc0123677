//! A stable-Rust fuzzer for the parsers that read files a user hands us: every log format
//! `extract-metrics` knows (bench JSONL, gzipped or not; HF Trainer stdout, results and state
//! JSON; llm.c stdout and `main.log`), the suite TOML ([`SuiteFile::parse`]) and the LAMBADA
//! reader ([`lambada_passages`]). No coverage feedback (that needs nightly's cargo-fuzz):
//! a xorshift mutator over the shipped fixtures (bit flips, byte sets, truncations, deletions,
//! duplications, splices of two seeds, inserted format tokens and multi-byte UTF-8).
//!
//! A parser may return an error for any input; it must never panic. `examples/fuzz.rs` runs a
//! target for a duration; `tests/fuzz_regressions.rs` replays every seed, a fixed-seed batch of
//! mutations and every crash found so far in `cargo test`.

use crate::data::{lambada_passages, DataFile};
use crate::report::extract::formats::{detect, parse, Format};
use crate::report::row::gunzip;
use crate::scenarios::suite_file::SuiteFile;
use std::path::{Path, PathBuf};

/// What is fuzzed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Format detection under several file names, then every parser (as `--format` forces);
    /// input starting with gzip's magic bytes is gunzipped first (as `*.jsonl.gz` is).
    Logs,
    /// `suites/*.toml` ([`SuiteFile::parse`]).
    Suite,
    /// LAMBADA JSONL ([`lambada_passages`]).
    Lambada,
}

pub const TARGETS: [Target; 3] = [Target::Logs, Target::Suite, Target::Lambada];

/// Every parser `--format` can force.
const FORMATS: [Format; 7] = [
    Format::BenchJsonl,
    Format::HfTrainerLog,
    Format::HfTrainerResults,
    Format::HfTrainerState,
    Format::LlmcLog,
    Format::LlmcMainLog,
    Format::ExtractCsv,
];

/// File names detection looks at (HF Trainer's fixed names, a bench log, a stdout capture, a
/// CSV).
const NAMES: [&str; 5] = [
    "run.jsonl",
    "trainer_state.json",
    "all_results.json",
    "train.log",
    "runs.csv",
];

/// Tokens the mutator inserts: JSON, TOML and log-line syntax, odd numbers, multi-byte UTF-8.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "'",
    "=",
    "\n",
    "\r\n",
    " ",
    "\t",
    "null",
    "true",
    "-1",
    "-0",
    "0.0",
    "1e309",
    "-1e309",
    "NaN",
    "inf",
    "nan",
    "-inf",
    "1e-400",
    "18446744073709551616",
    "-9223372036854775809",
    "\"record\"",
    "\"text\"",
    "\"log_history\"",
    "\"train_",
    "\"eval_",
    "\"\\ud800\"",
    "\\u0000",
    "[[",
    "]]",
    "\"\"\"",
    "'''",
    "#",
    "1979-05-27T07:32:00Z",
    "[sweep]",
    "[run]",
    "[data]",
    "step ",
    "/",
    "|",
    "s:",
    "trl:",
    "tel:",
    "lr:",
    "norm:",
    "val loss ",
    "***** train metrics *****",
    "{'loss': ",
    "  epoch = ",
    " = ",
    "ms",
    "%",
    "é",
    "€",
    "𝄞",
    "\u{0}",
    "\u{feff}",
];

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Logs => "logs",
            Target::Suite => "suite",
            Target::Lambada => "lambada",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        TARGETS.into_iter().find(|t| t.name() == name)
    }

    /// The seed files under the repository root `root`: the shipped fixtures of the format.
    pub fn seed_files(self, root: &Path) -> Vec<PathBuf> {
        let dirs: &[&str] = match self {
            Target::Logs => &[
                "tests/fixtures/logs/bench",
                "tests/fixtures/logs/hf_trainer",
                "tests/fixtures/logs/llmc",
                "tests/fixtures/logs/dp",
                "tests/fixtures/logs/tp",
                "tests/fixtures/fuzz/logs",
                // extract-metrics' own CSV, read back where named.
                "tests/fixtures/logs/golden/bench.csv",
            ],
            Target::Suite => &["suites", "tests/fixtures/fuzz/suite"],
            Target::Lambada => &["data/lambada_sample.jsonl", "tests/fixtures/fuzz/lambada"],
        };
        let mut files = vec![];
        for d in dirs {
            let p = root.join(d);
            if p.is_file() {
                files.push(p);
            } else if let Ok(entries) = std::fs::read_dir(&p) {
                let mut found: Vec<_> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.is_file())
                    .collect();
                found.sort();
                files.extend(found);
            }
        }
        files
    }

    /// The seeds' bytes; a gzipped log also gives its plain text, so both get mutated.
    pub fn seeds(self, root: &Path) -> Vec<Vec<u8>> {
        let mut seeds = vec![];
        for f in self.seed_files(root) {
            let Ok(bytes) = std::fs::read(&f) else {
                continue;
            };
            if bytes.starts_with(&[0x1f, 0x8b]) {
                if let Ok(plain) = gunzip(&bytes, &f) {
                    seeds.push(plain);
                }
            }
            seeds.push(bytes);
        }
        seeds
    }

    /// Feeds `input` to the target's parsers; errors are fine, a panic is the bug.
    pub fn run(self, input: &[u8]) {
        match self {
            Target::Logs => {
                let plain;
                let bytes = if input.starts_with(&[0x1f, 0x8b]) {
                    match gunzip(input, Path::new("fuzz.jsonl.gz")) {
                        Ok(p) => {
                            plain = p;
                            &plain[..]
                        }
                        Err(_) => return,
                    }
                } else {
                    input
                };
                // extract-metrics reads every log as lossy UTF-8.
                let text = String::from_utf8_lossy(bytes);
                for name in NAMES {
                    let path = Path::new(name);
                    if let Some(format) = detect(path, &text) {
                        let _ = parse(format, path, &text);
                    }
                }
                for format in FORMATS {
                    let _ = parse(format, Path::new("fuzz.log"), &text);
                }
            }
            Target::Suite => {
                // `SuiteFile::from_path` reads with `read_to_string`: only UTF-8 reaches the parser.
                if let Ok(text) = std::str::from_utf8(input) {
                    let _ = SuiteFile::parse(text, "fuzz.toml").map(|s| s.data_hint());
                }
            }
            Target::Lambada => {
                if let Ok(text) = std::str::from_utf8(input) {
                    let data = DataFile {
                        origin: "fuzz.jsonl".into(),
                        text: text.into(),
                    };
                    let _ = lambada_passages(&data);
                }
            }
        }
    }
}

/// xorshift64*: a tiny deterministic generator, so a run is reproduced by its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Inputs longer than this are cut (the largest fixture is 66 KB).
pub const MAX_LEN: usize = 256 * 1024;

/// A mutation of one of `seeds`: 1 to 8 edits, sometimes spliced with a second seed.
pub fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    let edits = 1 + rng.below(8);
    for _ in 0..edits {
        let len = data.len();
        match rng.below(9) {
            // Flip one bit.
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            // Set a byte to anything.
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next_u64() as u8;
            }
            // Truncate.
            2 if len > 0 => data.truncate(rng.below(len)),
            // Delete a range.
            3 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                data.drain(a..b);
            }
            // Duplicate a range in place.
            4 if len > 0 => {
                let a = rng.below(len);
                let b = (a + 1 + rng.below(256)).min(len);
                let piece = data[a..b].to_vec();
                let at = rng.below(data.len() + 1);
                data.splice(at..at, piece);
            }
            // Splice: our head, another seed's tail.
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            // Insert a token (often at a line start or after a separator, where parsers branch).
            6..=8 => {
                let tok = TOKENS[rng.below(TOKENS.len())].as_bytes();
                let mut at = rng.below(len + 1);
                if rng.below(2) == 0 {
                    while at < data.len() && !matches!(data[at], b'\n' | b' ' | b':' | b',') {
                        at += 1;
                    }
                    at = (at + 1).min(data.len());
                }
                data.splice(at..at, tok.iter().copied());
            }
            _ => {}
        }
    }
    data.truncate(MAX_LEN);
    data
}

/// Runs `input` through `target`, catching a panic: `Err(message)` if it panicked.
pub fn run_caught(target: Target, input: &[u8]) -> std::result::Result<(), String> {
    std::panic::catch_unwind(|| target.run(input)).map_err(|e| {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic with a non-string payload".into())
    })
}
