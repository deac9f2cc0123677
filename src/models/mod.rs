//! Models the bench runs, and how a `--model NAME` or `--model-dir DIR` becomes one.
//!
//! Each architecture lives in its own file; what they really share (the attention core,
//! weight loading) lives in [`attention`] and [`weights`]. Suites only see [`CausalLm`].

pub mod attention;
pub mod gpt2;
pub mod layers;
pub mod weights;

use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;
use std::path::Path;
pub use weights::WeightSource;

/// What a suite needs from a causal language model.
pub trait CausalLm {
    /// Final hidden states (after the last norm). input_ids: (B, T) u32; attention_mask:
    /// (B, T) u32, 1 for real tokens, 0 for right padding. Returns (B, T, C).
    fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle_core::Result<Tensor>;

    /// LM-head logits of selected hidden states: (N, C) -> (N, V). Kept apart from
    /// [`CausalLm::hidden_states`] so that scoring computes only the rows it reads.
    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor>;

    /// Longest sequence the model accepts.
    fn max_positions(&self) -> usize;
}

/// Architecture + config of a model, before any weights exist.
#[derive(Clone, Debug, PartialEq)]
pub enum Architecture {
    Gpt2(gpt2::Config),
}

/// A named model: a preset or the config.json of a model directory.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub name: String,
    pub arch: Architecture,
}

/// Model facts recorded in every log header.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub architecture: String,
    pub n_parameters: usize,
    pub weights: String,
}

/// Named presets, in the order `--help` and errors list them.
pub const PRESETS: &[&str] = &["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-tiny"];

impl ModelSpec {
    pub fn preset(name: &str) -> Result<Self> {
        let cfg = match name {
            "gpt2" => gpt2::Config::gpt2_124m(),
            "gpt2-medium" => gpt2::Config::gpt2_medium(),
            "gpt2-large" => gpt2::Config::gpt2_large(),
            "gpt2-xl" => gpt2::Config::gpt2_xl(),
            "gpt2-tiny" => gpt2::Config::gpt2_tiny(),
            _ => {
                return Err(Error::UnknownModel {
                    name: name.into(),
                    valid: PRESETS.join(", "),
                })
            }
        };
        Ok(Self {
            name: name.into(),
            arch: Architecture::Gpt2(cfg),
        })
    }

    /// Reads `DIR/config.json` (HF format); `model_type` picks the architecture.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::NotFound {
                    what: "config.json".into(),
                    path: path.clone(),
                    hint: "--model-dir must be an HF model directory (config.json + model.safetensors)".into(),
                }
            } else {
                Error::io(format!("reading {}", path.display()), e)
            }
        })?;
        let bad = |e: serde_json::Error| Error::Config(format!("{}: {e}", path.display()));
        let json: serde_json::Value = serde_json::from_str(&text).map_err(bad)?;
        let arch = match json["model_type"].as_str() {
            Some("gpt2") => Architecture::Gpt2(serde_json::from_value(json).map_err(bad)?),
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "{}: model_type '{other}' is not supported (supported: gpt2)",
                    path.display()
                )))
            }
            None => {
                return Err(Error::Config(format!(
                    "{}: no \"model_type\" key",
                    path.display()
                )))
            }
        };
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        Ok(Self { name, arch })
    }

    pub fn architecture(&self) -> &'static str {
        match self.arch {
            Architecture::Gpt2(_) => "gpt2",
        }
    }

    pub fn n_parameters(&self) -> usize {
        match &self.arch {
            Architecture::Gpt2(c) => c.n_parameters(),
        }
    }

    pub fn info(&self, source: &WeightSource) -> ModelInfo {
        ModelInfo {
            name: self.name.clone(),
            architecture: self.architecture().into(),
            n_parameters: self.n_parameters(),
            weights: source.describe(),
        }
    }

    /// Builds the model on `device` in `dtype` from `source`.
    pub fn load(
        &self,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
    ) -> Result<Box<dyn CausalLm>> {
        match &self.arch {
            Architecture::Gpt2(cfg) => {
                cfg.validate()?;
                let vb = source.var_builder(dtype, device, gpt2::Gpt2::PREFIXES)?;
                Ok(Box::new(gpt2::Gpt2::load(vb, cfg).map_err(unwrap_candle)?))
            }
        }
    }
}

/// Our own errors travel through candle's `Result` inside loaders (as `Error::Wrapped`, a
/// boxed `Display`); take the message back out so the user sees it without candle's wrapper.
fn unwrap_candle(e: candle_core::Error) -> Error {
    match e {
        candle_core::Error::Wrapped(inner) => Error::Config(inner.to_string()),
        candle_core::Error::WithBacktrace { inner, .. } => unwrap_candle(*inner),
        other => Error::Candle(other),
    }
}
