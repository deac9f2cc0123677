//! HF `GPT2Config` as read from `config.json`: the presets of the published sizes, its checks,
//! how tensor parallelism splits each weight, and the parameter count.

use crate::error::{Error, Result};
use crate::models::layers::Activation;
use crate::models::shard::Split;
use serde::Deserialize;

fn default_activation() -> String {
    "gelu_new".into()
}
fn default_eps() -> f64 {
    1e-5
}
fn default_init_range() -> f64 {
    0.02
}
fn default_true() -> bool {
    true
}
fn default_pdrop() -> f32 {
    0.1
}

/// HF `GPT2Config`, read straight from `config.json` (HF key names).
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub n_positions: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    #[serde(default)]
    pub n_inner: Option<usize>,
    #[serde(default = "default_activation")]
    pub activation_function: String,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub add_cross_attention: bool,
    /// Dropout on each residual branch (training only).
    #[serde(default = "default_pdrop")]
    pub resid_pdrop: f32,
    /// Dropout after the embeddings (training only).
    #[serde(default = "default_pdrop")]
    pub embd_pdrop: f32,
    /// Dropout on the attention probabilities (training only).
    #[serde(default = "default_pdrop")]
    pub attn_pdrop: f32,
}

impl Config {
    fn preset(n_embd: usize, n_layer: usize, n_head: usize) -> Self {
        Self {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd,
            n_layer,
            n_head,
            n_inner: None,
            activation_function: default_activation(),
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            tie_word_embeddings: true,
            add_cross_attention: false,
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
        }
    }
    pub fn gpt2_124m() -> Self {
        Self::preset(768, 12, 12)
    }
    pub fn gpt2_medium() -> Self {
        Self::preset(1024, 24, 16)
    }
    pub fn gpt2_large() -> Self {
        Self::preset(1280, 36, 20)
    }
    pub fn gpt2_xl() -> Self {
        Self::preset(1600, 48, 25)
    }
    /// 2 layers, 64 channels, GPT-2's vocabulary: the embedded CPU default and CI's model.
    pub fn gpt2_tiny() -> Self {
        Self::preset(64, 2, 4)
    }

    pub fn n_inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    /// The attention scores' scale in layer `layer_idx`: 1/√hs (`scale_attn_weights`), divided
    /// by layer_idx + 1 with `scale_attn_by_inverse_layer_idx`.
    pub fn attn_scale(&self, layer_idx: usize) -> f64 {
        let hs = (self.n_embd / self.n_head) as f64;
        let scale = if self.scale_attn_weights {
            1. / hs.sqrt()
        } else {
            1.
        };
        match self.scale_attn_by_inverse_layer_idx {
            true => scale / (layer_idx + 1) as f64,
            false => scale,
        }
    }

    /// Rejects configs this implementation would silently compute wrong.
    pub fn validate(&self) -> Result<()> {
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::Config(format!(
                "n_embd {} is not divisible by n_head {}",
                self.n_embd, self.n_head
            )));
        }
        if self.add_cross_attention {
            return Err(Error::Unsupported(
                "GPT-2 with add_cross_attention (encoder-decoder) is not supported".into(),
            ));
        }
        Activation::parse(&self.activation_function).map(|_| ())
    }

    /// What rank of a tensor-parallel group holds of each weight (checkpoint names without the
    /// `transformer.` prefix): q, k, v and `c_fc` split by columns (heads, hidden units), both
    /// `c_proj`s by rows; Conv1D weights are (in, out). Everything else is replicated.
    pub fn tp_split(&self, name: &str) -> Option<Split> {
        let hs = self.n_embd / self.n_head;
        let (dim, blocks, unit) = match name {
            n if n.ends_with("attn.c_attn.weight") => (1, 3, hs),
            n if n.ends_with("attn.c_attn.bias") => (0, 3, hs),
            n if n.ends_with("attn.c_proj.weight") => (0, 1, hs),
            n if n.ends_with("mlp.c_fc.weight") => (1, 1, 1),
            n if n.ends_with("mlp.c_fc.bias") => (0, 1, 1),
            n if n.ends_with("mlp.c_proj.weight") => (0, 1, 1),
            _ => return None,
        };
        Some(Split { dim, blocks, unit })
    }

    /// Stored parameters, the tied LM head counted once (as HF's `num_parameters()`).
    pub fn n_parameters(&self) -> usize {
        let (c, f) = (self.n_embd, self.n_inner());
        let block = 2 * 2 * c // ln_1, ln_2
            + c * 3 * c + 3 * c // c_attn
            + c * c + c // attn.c_proj
            + c * f + f // c_fc
            + f * c + c; // mlp.c_proj
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * c
        };
        self.vocab_size * c + self.n_positions * c + self.n_layer * block + 2 * c + head
    }
}
