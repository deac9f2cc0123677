//! Text -> token ids. GPT-2's byte-level BPE ships inside the binary (tiktoken-rs's r50k
//! ranks: works offline); a model directory's `tokenizer.json` goes through HF `tokenizers`.

use crate::error::{Error, Result};
use std::path::Path;

pub enum TextTokenizer {
    /// GPT-2's BPE (r50k_base), the tokenizer of every GPT-2 checkpoint. `proxy`: standing in
    /// for another model's missing tokenizer (random weights only), as a realistic length proxy.
    Gpt2Bpe {
        bpe: tiktoken_rs::CoreBPE,
        proxy: bool,
    },
    /// An HF `tokenizer.json`.
    HuggingFace(Box<tokenizers::Tokenizer>),
}

impl TextTokenizer {
    pub fn gpt2() -> Result<Self> {
        tiktoken_rs::r50k_base()
            .map(|bpe| Self::Gpt2Bpe { bpe, proxy: false })
            .map_err(|e| Error::Config(format!("cannot build the GPT-2 BPE: {e}")))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        tokenizers::Tokenizer::from_file(path)
            .map(|t| Self::HuggingFace(Box::new(t)))
            .map_err(|e| Error::Config(format!("{}: cannot load tokenizer: {e}", path.display())))
    }

    /// `DIR/tokenizer.json` when a model dir has one, else GPT-2's BPE: GPT-2's own tokenizer
    /// for `architecture` "gpt2", a stand-in (said so in the log header) for any other.
    pub fn for_model(dir: Option<&Path>, architecture: &str) -> Result<Self> {
        match dir.map(|d| d.join("tokenizer.json")) {
            Some(p) if p.is_file() => Self::from_file(&p),
            _ => Self::gpt2().map(|t| match t {
                Self::Gpt2Bpe { bpe, .. } => Self::Gpt2Bpe {
                    bpe,
                    proxy: architecture != "gpt2",
                },
                other => other,
            }),
        }
    }

    /// What the log header records.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Gpt2Bpe { proxy: false, .. } => "gpt2 (r50k BPE, built in)",
            Self::Gpt2Bpe { proxy: true, .. } => "gpt2 (proxy)",
            Self::HuggingFace(_) => "tokenizer.json",
        }
    }

    /// The id of the token that ends a document (`<|endoftext|>`, BLOOM's `</s>`).
    pub fn end_of_text(&self) -> Result<u32> {
        match self {
            Self::Gpt2Bpe { .. } => Ok(50256),
            Self::HuggingFace(t) => ["<|endoftext|>", "</s>", "<eos>"]
                .iter()
                .find_map(|s| t.token_to_id(s))
                .ok_or_else(|| {
                    Error::Config(
                        "the tokenizer has no end-of-text token (<|endoftext|>, </s> or <eos>)"
                            .into(),
                    )
                }),
        }
    }

    /// Token ids of `text`, no special tokens added and none parsed from the text (as lm-eval's
    /// `tok_encode` for causal models).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Self::Gpt2Bpe { bpe, .. } => Ok(bpe.encode_ordinary(text)),
            Self::HuggingFace(t) => t
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| Error::Config(format!("tokenizer failed: {e}"))),
        }
    }
}
