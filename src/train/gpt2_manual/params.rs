//! GPT-2's parameters by checkpoint name, as one typed tree: the weights the manual step reads
//! (compute-dtype copies of the fp32 masters) and the gradients it produces have this shape.
//!
//! Shapes: `C` channels (n_embd), `F` the MLP's hidden units (n_inner), `V` vocab, `P`
//! n_positions. Projections are HF's Conv1D: weight (in, out).

use crate::models::gpt2::Config;
use candle_core::{Result, Tensor};

/// A LayerNorm's weight and bias, (C,) each.
#[derive(Clone)]
pub struct Norm {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// A projection x W + b: weight (in, out) (Conv1D), bias (out,).
#[derive(Clone)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Tensor,
}

/// One block, fields named after the checkpoint's `h.{i}.…` tensors.
#[derive(Clone)]
pub struct Block {
    pub ln_1: Norm,
    pub c_attn: Linear,    // (C, 3C): [q | k | v]
    pub attn_proj: Linear, // attn.c_proj (C, C)
    pub ln_2: Norm,
    pub c_fc: Linear,     // (C, F)
    pub mlp_proj: Linear, // mlp.c_proj (F, C)
}

impl Block {
    /// The block's tensors in [`Gpt2Params::into_named`]'s order.
    pub fn into_vec(self) -> Vec<Tensor> {
        let pairs = [
            (self.ln_1.weight, self.ln_1.bias),
            (self.c_attn.weight, self.c_attn.bias),
            (self.attn_proj.weight, self.attn_proj.bias),
            (self.ln_2.weight, self.ln_2.bias),
            (self.c_fc.weight, self.c_fc.bias),
            (self.mlp_proj.weight, self.mlp_proj.bias),
        ];
        pairs.into_iter().flat_map(|(w, b)| [w, b]).collect()
    }

    /// The inverse of [`Block::into_vec`].
    pub fn from_vec(v: Vec<Tensor>) -> Result<Self> {
        let Ok([a, b, c, d, e, f, g, h, i, j, k, l]) = <[Tensor; 12]>::try_from(v) else {
            candle_core::bail!("a block has 12 tensors")
        };
        Ok(Self {
            ln_1: norm((a, b)),
            c_attn: linear((c, d)),
            attn_proj: linear((e, f)),
            ln_2: norm((g, h)),
            c_fc: linear((i, j)),
            mlp_proj: linear((k, l)),
        })
    }
}

/// The checkpoint names of [`Block::into_vec`]'s (weight, bias) pairs, after `h.{i}.`.
const BLOCK_PAIRS: [&str; 6] = [
    "ln_1",
    "attn.c_attn",
    "attn.c_proj",
    "ln_2",
    "mlp.c_fc",
    "mlp.c_proj",
];

/// A group of gradients the manual backward hands over as soon as it is final, in this order:
/// ln_f's, each block's from the last, then the embeddings' (and an untied head's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    LnF,
    Block(usize),
    Embeddings,
}

impl Group {
    /// The checkpoint names of the group's tensors, in the order they are handed over.
    pub fn names(self, tied: bool) -> Vec<String> {
        match self {
            Group::LnF => vec!["ln_f.weight".into(), "ln_f.bias".into()],
            Group::Block(i) => BLOCK_PAIRS
                .iter()
                .flat_map(|p| [format!("h.{i}.{p}.weight"), format!("h.{i}.{p}.bias")])
                .collect(),
            Group::Embeddings => {
                let mut names = vec!["wte.weight".to_string(), "wpe.weight".to_string()];
                if !tied {
                    names.push("lm_head.weight".into());
                }
                names
            }
        }
    }
}

/// Every parameter of `GPT2LMHeadModel`.
pub struct Gpt2Params {
    pub wte: Tensor, // (V, C)
    pub wpe: Tensor, // (P, C)
    pub h: Vec<Block>,
    pub ln_f: Norm,
    /// (V, C) when the head is not tied to `wte`.
    pub lm_head: Option<Tensor>,
}

impl Gpt2Params {
    /// Each tensor from `get(name)`, with the checkpoint's names (`wte.weight`,
    /// `h.0.attn.c_attn.weight`, …, no `transformer.` prefix).
    pub fn load(cfg: &Config, mut get: impl FnMut(&str) -> Result<Tensor>) -> Result<Self> {
        // (weight, bias) of the tensor pair `p`.
        let mut pair = |p: &str| -> Result<(Tensor, Tensor)> {
            Ok((get(&format!("{p}.weight"))?, get(&format!("{p}.bias"))?))
        };
        let mut h = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            h.push(Block {
                ln_1: norm(pair(&format!("h.{i}.ln_1"))?),
                c_attn: linear(pair(&format!("h.{i}.attn.c_attn"))?),
                attn_proj: linear(pair(&format!("h.{i}.attn.c_proj"))?),
                ln_2: norm(pair(&format!("h.{i}.ln_2"))?),
                c_fc: linear(pair(&format!("h.{i}.mlp.c_fc"))?),
                mlp_proj: linear(pair(&format!("h.{i}.mlp.c_proj"))?),
            });
        }
        let ln_f = norm(pair("ln_f")?);
        let wte = get("wte.weight")?;
        let wpe = get("wpe.weight")?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(get("lm_head.weight")?),
        };
        Ok(Self {
            wte,
            wpe,
            h,
            ln_f,
            lm_head,
        })
    }

    /// (checkpoint name, tensor) of every parameter, the names of [`Gpt2Params::load`].
    pub fn into_named(self) -> Vec<(String, Tensor)> {
        let mut out = vec![
            ("wte.weight".to_string(), self.wte),
            ("wpe.weight".to_string(), self.wpe),
        ];
        let mut push = |name: String, w: Tensor, b: Tensor| {
            out.push((format!("{name}.weight"), w));
            out.push((format!("{name}.bias"), b));
        };
        for (i, b) in self.h.into_iter().enumerate() {
            for (name, pair) in BLOCK_PAIRS.iter().zip(b.into_vec().chunks(2)) {
                push(format!("h.{i}.{name}"), pair[0].clone(), pair[1].clone());
            }
        }
        push("ln_f".into(), self.ln_f.weight, self.ln_f.bias);
        if let Some(head) = self.lm_head {
            out.push(("lm_head.weight".into(), head));
        }
        out
    }
}

fn norm((weight, bias): (Tensor, Tensor)) -> Norm {
    Norm { weight, bias }
}

fn linear((weight, bias): (Tensor, Tensor)) -> Linear {
    Linear { weight, bias }
}
