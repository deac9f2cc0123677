//! Tiny Shakespeare (`--suite shakespeare`) as llm.c's `dev/data/tinyshakespeare.py` prepares
//! it: each statement of the dialogue (the text up to and including a blank line) is a
//! document opened by `<|endoftext|>`, the first 32,768 tokens (≈ 10 %) are the validation
//! split and the rest the training split. Each split is cut into consecutive blocks of
//! `--block-size` tokens (a split's last partial block is dropped), which the training
//! scenario ([`super`]) trains on and evaluates like WikiText-2's blocks.

use super::data::{Corpus, Splits, TextSplit};
use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;
use std::path::Path;

/// The first 437 lines of `input.txt`, built into the binary (data/README.md).
pub const SAMPLE: &str = include_str!("../../../data/shakespeare_sample.txt");

/// llm.c's validation split: the first 32,768 tokens of the 338,025 (9.7 %).
const VAL_TOKENS: usize = 32_768;

/// The text as both splits (they are cut from its tokens): the built-in sample, `--data FILE`
/// or `--data DIR` holding `input.txt`.
pub fn splits(data: Option<&Path>) -> Result<Splits> {
    let (origin, text) = match data {
        None => (
            "embedded:shakespeare_sample.txt".to_string(),
            SAMPLE.to_string(),
        ),
        Some(p) => {
            let file = match p.is_dir() {
                true => p.join("input.txt"),
                false => p.to_path_buf(),
            };
            let text = std::fs::read_to_string(&file).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::NotFound {
                    what: "Tiny Shakespeare".into(),
                    path: file.clone(),
                    hint: "pass --data with tinyshakespeare's input.txt (or its directory), or --data full".into(),
                },
                _ => Error::io(format!("reading {}", file.display()), e),
            })?;
            (file.display().to_string(), text)
        }
    };
    Ok(splits_of(origin, text))
}

/// `text` (from `origin`) as both splits.
pub fn splits_of(origin: String, text: String) -> Splits {
    let split = TextSplit { origin, text };
    Splits {
        note: format!(
            "llm.c's tinyshakespeare split of {}: statements opened by <|endoftext|>, the first min(32768, 10 %) tokens evaluated, the rest trained",
            split.origin
        ),
        train: split.clone(),
        eval: split,
        corpus: Corpus::Dialogue,
    }
}

/// The token ids of `text`: `<|endoftext|>` before each statement (llm.c's
/// `"<|endoftext|>" + text.replace("\n\n", "\n\n<|endoftext|>")`, whose specials tiktoken
/// encodes apart from the text between them).
pub fn tokens(text: &str, tok: &TextTokenizer) -> Result<Vec<u32>> {
    let eot = tok.end_of_text()?;
    let mut ids = Vec::with_capacity(text.len() / 3);
    for statement in text.split_inclusive("\n\n") {
        ids.push(eot);
        ids.extend(tok.encode(statement)?);
    }
    if text.is_empty() || text.ends_with("\n\n") {
        ids.push(eot);
    }
    Ok(ids)
}

/// Blocks of token ids, each `--block-size` long.
pub type Blocks = Vec<Vec<u32>>;

/// (train, eval) blocks of `block_size` from the dialogue's tokens: the first
/// min(32768, n/10) tokens evaluate, the rest train.
pub fn blocks(text: &str, tok: &TextTokenizer, block_size: usize) -> Result<(Blocks, Blocks)> {
    let ids = tokens(text, tok)?;
    let (eval, train) = ids.split_at(VAL_TOKENS.min(ids.len() / 10));
    let cut = |s: &[u32]| s.chunks_exact(block_size).map(<[u32]>::to_vec).collect();
    Ok((cut(train), cut(eval)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statements are split after each blank line and opened by <|endoftext|> (50256), as
    /// llm.c's replace does; the evaluation tokens come first.
    #[test]
    fn statements_open_with_end_of_text_and_eval_comes_first() -> Result<()> {
        let tok = TextTokenizer::gpt2()?;
        let text = "First Citizen:\nSpeak.\n\nAll:\nSpeak, speak.\n\n";
        let ids = tokens(text, &tok)?;
        let a = tok.encode("First Citizen:\nSpeak.\n\n")?;
        let b = tok.encode("All:\nSpeak, speak.\n\n")?;
        let want: Vec<u32> = [vec![50256], a, vec![50256], b, vec![50256]].concat();
        assert_eq!(ids, want);
        let sample = tokens(SAMPLE, &tok)?;
        let (train, eval) = blocks(SAMPLE, &tok, 16)?;
        let n_eval = sample.len() / 10;
        assert_eq!(eval.len(), n_eval / 16);
        assert_eq!(train.len(), (sample.len() - n_eval) / 16);
        assert_eq!(eval[0], sample[..16]);
        assert_eq!(train[0], sample[n_eval..n_eval + 16]);
        Ok(())
    }
}
