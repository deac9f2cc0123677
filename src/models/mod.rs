//! Models the bench runs, and how a `--model NAME` or `--model-dir DIR` becomes one.
//!
//! Each architecture lives in its own file; what they really share (the attention core,
//! weight loading) lives in [`attention`] and [`weights`]. Suites only see [`CausalLm`];
//! incremental decoding goes through its KV cache ([`cache`]) and [`generate`]; continuous
//! batching through [`slots`], rows of one cache that requests join and leave.

pub mod attention;
pub mod bloom;
pub mod cache;
mod causal_lm;
pub mod fp8;
pub mod generate;
pub mod gpt2;
pub mod handoff;
pub mod head;
pub mod layers;
#[cfg(test)]
mod load_tests;
pub mod loss;
pub mod norm_fold;
pub mod shard;
#[cfg(test)]
mod shard_tests;
pub mod slots;
mod step;
pub mod weights;

use crate::dist::Tp;
use crate::error::{Error, Result};
pub use cache::KvCache;
use candle_core::{DType, Device};
pub use causal_lm::CausalLm;
use indicatif::ProgressBar;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
pub use weights::{Recorder, WeightSource};

/// Architecture + config of a model, before any weights exist.
#[derive(Clone, Debug, PartialEq)]
pub enum Architecture {
    Gpt2(gpt2::Config),
    Bloom(bloom::Config),
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
pub const PRESETS: &[&str] = &[
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "gpt2-tiny",
    "bloom-560m",
    "bloom-1b1",
    "bloom-1b7",
    "bloom-3b",
    "bloom-7b1",
    "bloom",
    "bloom-tiny",
];

impl ModelSpec {
    pub fn preset(name: &str) -> Result<Self> {
        use Architecture::{Bloom, Gpt2};
        let arch = match name {
            "gpt2" => Gpt2(gpt2::Config::gpt2_124m()),
            "gpt2-medium" => Gpt2(gpt2::Config::gpt2_medium()),
            "gpt2-large" => Gpt2(gpt2::Config::gpt2_large()),
            "gpt2-xl" => Gpt2(gpt2::Config::gpt2_xl()),
            "gpt2-tiny" => Gpt2(gpt2::Config::gpt2_tiny()),
            "bloom-560m" => Bloom(bloom::Config::bloom_560m()),
            "bloom-1b1" => Bloom(bloom::Config::bloom_1b1()),
            "bloom-1b7" => Bloom(bloom::Config::bloom_1b7()),
            "bloom-3b" => Bloom(bloom::Config::bloom_3b()),
            "bloom-7b1" => Bloom(bloom::Config::bloom_7b1()),
            "bloom" => Bloom(bloom::Config::bloom_176b()),
            "bloom-tiny" => Bloom(bloom::Config::bloom_tiny()),
            _ => {
                return Err(Error::UnknownModel {
                    name: name.into(),
                    valid: PRESETS.join(", "),
                })
            }
        };
        Ok(Self {
            name: name.into(),
            arch,
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
            Some("bloom") => Architecture::Bloom(serde_json::from_value(json).map_err(bad)?),
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "{}: model_type '{other}' is not supported (supported: gpt2, bloom)",
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
            Architecture::Bloom(_) => "bloom",
        }
    }

    /// The attention heads' size.
    pub fn head_size(&self) -> usize {
        match &self.arch {
            Architecture::Gpt2(c) => c.n_embd / c.n_head,
            Architecture::Bloom(c) => c.hidden_size / c.n_head,
        }
    }

    pub fn n_parameters(&self) -> usize {
        match &self.arch {
            Architecture::Gpt2(c) => c.n_parameters(),
            Architecture::Bloom(c) => c.n_parameters(),
        }
    }

    /// `source`: where the weights were read from; `requested`: what the user asked for (random
    /// weights read back from their cached checkpoint are described as both).
    pub fn info(&self, source: &WeightSource, requested: &WeightSource) -> ModelInfo {
        let weights = match (requested, source) {
            (WeightSource::Random { seed }, WeightSource::Dir(dir)) => {
                format!("random (seed {seed}) via {}", dir.display())
            }
            _ => source.describe(),
        };
        ModelInfo {
            name: self.name.clone(),
            architecture: self.architecture().into(),
            n_parameters: self.n_parameters(),
            weights,
        }
    }

    /// Builds the model on `device` in `dtype` from `source`.
    pub fn load(
        &self,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
    ) -> Result<Box<dyn CausalLm>> {
        self.load_recording(source, dtype, device, None)
    }

    /// [`ModelSpec::load`], keeping random tensors in `record` (for `--save-weights`).
    pub fn load_recording(
        &self,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
        record: Option<weights::Recorder>,
    ) -> Result<Box<dyn CausalLm>> {
        self.load_watched(source, dtype, device, record, &ProgressBar::hidden())
    }

    /// [`ModelSpec::load_recording`], counting on `progress` the bytes of every tensor loaded
    /// (what the checkpoint stores of it, or what random init made).
    pub fn load_watched(
        &self,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
        record: Option<weights::Recorder>,
        progress: &ProgressBar,
    ) -> Result<Box<dyn CausalLm>> {
        let backend = source.backend_watched(self.prefixes(), record, progress)?;
        self.load_backend(backend, dtype, device)
    }

    /// Checkpoint-name prefixes tried in front of every tensor name.
    pub fn prefixes(&self) -> &'static [&'static str] {
        match self.arch {
            Architecture::Gpt2(_) => gpt2::Gpt2::PREFIXES,
            Architecture::Bloom(_) => bloom::Bloom::PREFIXES,
        }
    }

    /// Builds the model from any tensor source (training wraps its parameters in one), each
    /// tensor asked for in `dtype`.
    pub fn load_backend(
        &self,
        backend: Box<dyn candle_nn::var_builder::SimpleBackend>,
        dtype: DType,
        device: &Device,
    ) -> Result<Box<dyn CausalLm>> {
        self.load_shard_backend(backend, dtype, device, &Tp::single())
    }

    /// Rank `tp.rank`'s shard of the model, its weights read from `source` a slice at a time.
    pub fn load_shard(
        &self,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
        tp: &Tp,
    ) -> Result<Box<dyn CausalLm>> {
        self.load_shard_watched(source, dtype, device, tp, &ProgressBar::hidden())
    }

    /// [`ModelSpec::load_shard`], counting the bytes of this rank's tensors on `progress`.
    pub fn load_shard_watched(
        &self,
        source: &WeightSource,
        dtype: DType,
        device: &Device,
        tp: &Tp,
        progress: &ProgressBar,
    ) -> Result<Box<dyn CausalLm>> {
        self.check_tp(tp.size)?;
        let arch = self.arch.clone();
        let rule: shard::SplitRule = Arc::new(move |name: &str| match &arch {
            Architecture::Gpt2(c) => c.tp_split(name),
            Architecture::Bloom(c) => c.tp_split(name),
        });
        let backend =
            source.sharded_backend(self.prefixes(), (tp.rank, tp.size), rule, progress)?;
        self.load_shard_backend(backend, dtype, device, tp)
    }

    /// Tensor parallelism splits heads and hidden units: each rank needs at least one of each.
    pub fn check_tp(&self, size: usize) -> Result<()> {
        let (heads, hidden) = match &self.arch {
            Architecture::Gpt2(c) => (c.n_head, c.n_inner()),
            Architecture::Bloom(c) => (c.n_head, 4 * c.hidden_size),
        };
        if size == 0 || size > heads || size > hidden {
            return Err(Error::Config(format!(
                "--tp {size}: {} has {heads} attention heads; use 1 to {heads} ranks",
                self.name
            )));
        }
        Ok(())
    }

    fn load_shard_backend(
        &self,
        backend: Box<dyn candle_nn::var_builder::SimpleBackend>,
        dtype: DType,
        device: &Device,
        tp: &Tp,
    ) -> Result<Box<dyn CausalLm>> {
        let vb = candle_nn::VarBuilder::from_backend(backend, dtype, device.clone());
        match &self.arch {
            Architecture::Gpt2(cfg) => {
                cfg.validate()?;
                Ok(Box::new(
                    gpt2::Gpt2::load(vb, cfg, tp).map_err(unwrap_candle)?,
                ))
            }
            Architecture::Bloom(cfg) => {
                cfg.validate()?;
                Ok(Box::new(
                    bloom::Bloom::load(vb, cfg, tp).map_err(unwrap_candle)?,
                ))
            }
        }
    }

    /// `config.json` as transformers writes it for this model.
    pub fn hf_config(&self, dtype: DType) -> serde_json::Value {
        let (mut json, model_type, class) = match &self.arch {
            Architecture::Gpt2(c) => (serde_json::to_value(c), "gpt2", "GPT2LMHeadModel"),
            Architecture::Bloom(c) => (serde_json::to_value(c), "bloom", "BloomForCausalLM"),
        };
        let json = json
            .as_mut()
            .expect("configs serialize")
            .as_object_mut()
            .expect("an object");
        json.insert("model_type".into(), model_type.into());
        json.insert("architectures".into(), serde_json::json!([class]));
        let torch_dtype = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        json.insert("torch_dtype".into(), torch_dtype.into());
        serde_json::Value::Object(json.clone())
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
