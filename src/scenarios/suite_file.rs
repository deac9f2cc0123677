//! Each suite's defaults: a `suites/NAME.toml` file, embedded in the binary
//! (`--suite-file PATH` replaces it); flags override them.

use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;

pub const LAMBADA_TOML: &str = include_str!("../../suites/lambada.toml");
pub const WIKITEXT2_TOML: &str = include_str!("../../suites/wikitext2.toml");
pub const GENERATION_TOML: &str = include_str!("../../suites/generation.toml");
pub const SHAKESPEARE_TOML: &str = include_str!("../../suites/shakespeare.toml");
pub const SERVING_TOML: &str = include_str!("../../suites/serving.toml");

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteFile {
    pub name: String,
    pub data: SuiteData,
    pub run: SuiteRun,
    /// A whole matrix in the file; each list is replaced by its flag (`--models` …).
    #[serde(default)]
    pub sweep: SuiteSweep,
    /// Training suites: HF Trainer defaults of the run.
    #[serde(default)]
    pub train: Option<SuiteTrain>,
    /// The generation suite: prompt length and new tokens of a run.
    #[serde(default)]
    pub generation: Option<SuiteGeneration>,
    /// The serving suite: the load its runs put on the engine.
    #[serde(default)]
    pub serving: Option<SuiteServing>,
}

/// `[serving]`: each key is replaced by its flag (`--num-requests`, `--request-rate`, …).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteServing {
    pub num_requests: usize,
    /// Requests/s (`inf`: every request at 0).
    pub request_rate: f64,
    #[serde(default = "one")]
    pub burstiness: f64,
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Tokens: `N` or a uniform range `A:B`.
    pub input_len: String,
    pub output_len: String,
    /// `continuous` or `static` (`--batching`); absent: continuous.
    #[serde(default)]
    pub batching: Option<String>,
}

fn one() -> f64 {
    1.
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteGeneration {
    pub prompt_len: usize,
    pub new_tokens: usize,
}

/// `[sweep]`: lists whose product runs as one sweep (see `crate::launch::sweep`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteSweep {
    pub models: Option<Vec<String>>,
    pub dtypes: Option<Vec<String>>,
    pub batch_sizes: Option<Vec<usize>>,
    pub seq_lens: Option<Vec<usize>>,
    pub engines: Option<Vec<String>>,
    pub repeat: Option<usize>,
    /// Generation suite: prompt lengths and new tokens (`--prompt-lens`, `--new-tokens`).
    pub prompt_lens: Option<Vec<usize>>,
    pub new_tokens: Option<Vec<usize>>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteTrain {
    pub epochs: f64,
    pub learning_rate: f64,
    pub lr_warmup_steps: usize,
    pub grad_accum: usize,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteData {
    /// File name of the full data set.
    pub file: String,
    pub sha256: String,
    pub n_samples: usize,
    pub url: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SuiteRun {
    pub batch_size: usize,
    pub warmup_batches: usize,
    /// Generation suite: timed calls per configuration.
    #[serde(default)]
    pub timed_batches: Option<usize>,
}

impl SuiteFile {
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config(format!("{origin}: {}", e.message())))
    }

    pub fn builtin(name: &str) -> Result<Self> {
        match name {
            "lambada" => Self::parse(LAMBADA_TOML, "suites/lambada.toml"),
            "wikitext2" => Self::parse(WIKITEXT2_TOML, "suites/wikitext2.toml"),
            "generation" => Self::parse(GENERATION_TOML, "suites/generation.toml"),
            "shakespeare" => Self::parse(SHAKESPEARE_TOML, "suites/shakespeare.toml"),
            "serving" => Self::parse(SERVING_TOML, "suites/serving.toml"),
            _ => Err(Error::Config(format!(
                "unknown suite '{name}': available suites are lambada, wikitext2, generation, shakespeare, serving"
            ))),
        }
    }

    pub fn from_path(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading suite file {}", path.display()), e))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// How to get the full data set, for error messages.
    pub fn data_hint(&self) -> String {
        format!(
            "download {} from {} (sha256 {}) and pass --data PATH, or put it in $BENCH_DATA_DIR",
            self.data.file, self.data.url, self.data.sha256
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_lambada_suite_parses() {
        let s = SuiteFile::builtin("lambada").unwrap();
        assert_eq!((s.run.batch_size, s.data.n_samples), (16, 5153));
    }

    #[test]
    fn builtin_serving_suite_parses() {
        let s = SuiteFile::builtin("serving").unwrap();
        let load = s.serving.unwrap();
        assert_eq!((load.num_requests, load.burstiness), (64, 1.));
    }

    #[test]
    fn suite_file_typos_are_errors() {
        let text = LAMBADA_TOML.replace("batch_size", "batchsize");
        let e = SuiteFile::parse(&text, "x.toml").unwrap_err().to_string();
        assert!(e.starts_with("x.toml: ") && e.contains("batchsize"), "{e}");
    }
}
