//! HF `BloomConfig` as read from `config.json`: the presets of the published sizes, its checks,
//! how tensor parallelism splits each weight, and the parameter count.

use crate::error::{Error, Result};
use crate::models::shard::Split;
use serde::Deserialize;

fn default_eps() -> f64 {
    1e-5
}
fn default_init_range() -> f64 {
    0.02
}
fn default_true() -> bool {
    true
}
fn default_tp() -> usize {
    1
}

/// HF `BloomConfig`, read straight from `config.json` (HF key names; old checkpoints say
/// `n_embed` for `hidden_size`, and `num_attention_heads` / `num_hidden_layers` are aliases).
#[derive(Clone, Debug, Deserialize, serde::Serialize, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    #[serde(alias = "n_embed")]
    pub hidden_size: usize,
    #[serde(alias = "num_hidden_layers")]
    pub n_layer: usize,
    #[serde(alias = "num_attention_heads")]
    pub n_head: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub apply_residual_connection_post_layernorm: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// Megatron's tensor-parallel degree at pre-training; only `slow_but_exact` uses it.
    #[serde(default = "default_tp")]
    pub pretraining_tp: usize,
    #[serde(default)]
    pub slow_but_exact: bool,
    /// Dropout on each residual branch (training only).
    #[serde(default)]
    pub hidden_dropout: f32,
    /// Dropout on the attention probabilities (training only).
    #[serde(default)]
    pub attention_dropout: f32,
}

impl Config {
    fn preset(hidden_size: usize, n_layer: usize, n_head: usize) -> Self {
        Self {
            vocab_size: 250880,
            hidden_size,
            n_layer,
            n_head,
            layer_norm_epsilon: 1e-5,
            initializer_range: 0.02,
            apply_residual_connection_post_layernorm: false,
            tie_word_embeddings: true,
            pretraining_tp: 1,
            slow_but_exact: false,
            hidden_dropout: 0.,
            attention_dropout: 0.,
        }
    }
    pub fn bloom_560m() -> Self {
        Self::preset(1024, 24, 16)
    }
    pub fn bloom_1b1() -> Self {
        Self::preset(1536, 24, 16)
    }
    pub fn bloom_1b7() -> Self {
        Self::preset(2048, 24, 16)
    }
    pub fn bloom_3b() -> Self {
        Self::preset(2560, 30, 32)
    }
    pub fn bloom_7b1() -> Self {
        Self::preset(4096, 30, 32)
    }
    /// The 176B model: for parameter counts and memory estimates.
    pub fn bloom_176b() -> Self {
        Self::preset(14336, 70, 112)
    }
    /// 2 layers, 64 channels, 4 heads: CI's BLOOM.
    pub fn bloom_tiny() -> Self {
        Self {
            vocab_size: 50257,
            ..Self::preset(64, 2, 4)
        }
    }

    pub fn validate(&self) -> Result<()> {
        if !self.hidden_size.is_multiple_of(self.n_head) {
            return Err(Error::Config(format!(
                "hidden_size {} is not divisible by n_head {}",
                self.hidden_size, self.n_head
            )));
        }
        if self.slow_but_exact && self.pretraining_tp > 1 {
            return Err(Error::Unsupported(
                "BLOOM with slow_but_exact and pretraining_tp > 1 is not supported".into(),
            ));
        }
        Ok(())
    }

    /// Stored parameters, the tied LM head counted once.
    pub fn n_parameters(&self) -> usize {
        let h = self.hidden_size;
        let block = 2 * 2 * h // input_layernorm, post_attention_layernorm
            + 3 * h * h + 3 * h // query_key_value
            + h * h + h // dense
            + 4 * h * h + 4 * h // dense_h_to_4h
            + 4 * h * h + h; // dense_4h_to_h
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + 2 * h + self.n_layer * block + 2 * h + head
    }

    /// What a rank of a tensor-parallel group holds of each weight (names without the
    /// `transformer.` prefix): `query_key_value` rows are laid out per head (nh, 3, hs), so a
    /// rank's heads are one contiguous block of 3·hs rows each; `dense_h_to_4h` split by rows
    /// (hidden units); `dense` and `dense_4h_to_h` by columns (their inputs). Linear weights
    /// are (out, in). Everything else is replicated.
    pub fn tp_split(&self, name: &str) -> Option<Split> {
        let hs = self.hidden_size / self.n_head;
        let (dim, unit) = match name {
            n if n.ends_with("self_attention.query_key_value.weight") => (0, 3 * hs),
            n if n.ends_with("self_attention.query_key_value.bias") => (0, 3 * hs),
            n if n.ends_with("self_attention.dense.weight") => (1, hs),
            n if n.ends_with("mlp.dense_h_to_4h.weight") => (0, 1),
            n if n.ends_with("mlp.dense_h_to_4h.bias") => (0, 1),
            n if n.ends_with("mlp.dense_4h_to_h.weight") => (1, 1),
            _ => return None,
        };
        Some(Split {
            dim,
            blocks: 1,
            unit,
        })
    }

    /// Longest input: BLOOM was trained on 2048 tokens; ALiBi itself has no limit (lm-eval's
    /// default max_length for models whose config names none is also 2048).
    pub const MAX_POSITIONS: usize = 2048;
}
