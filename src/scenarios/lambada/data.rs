//! LAMBADA last-word prediction, scored exactly like lm-evaluation-harness `lambada_openai`.
//!
//! Per passage: context = the text before its last space, target = " " + last word.
//! Tokens as lm-eval's `HFLM._encode_pair`: whole = tok(context + target), ctx = tok(context),
//! target tokens = whole[len(ctx)..]. The model reads (ctx + target)[-(max_len + 1)..][..-1];
//! the passage's log-likelihood is the sum of log p(target token) at the target positions, and
//! it is `greedy` when every target token is the argmax. Metrics: [`crate::metrics`].
//!
//! Batches keep file order and are right-padded to their longest row (rounded up to
//! `--pad-multiple`); with a causal mask no real token ever sees padding, so results depend on
//! neither the batch size nor the padding.

use crate::engines::candle::target_scores;
use crate::engines::{Request, TargetScores};
use crate::error::{Error, Result};
use crate::models::CausalLm;
use crate::record::PassageResult;
use crate::tokenizer::TextTokenizer;
use candle_core::Device;

/// lm-eval's `doc_to_text` / `doc_to_target`: split at the last space.
pub fn split_passage(text: &str) -> (&str, String) {
    match text.rsplit_once(' ') {
        Some((context, word)) => (context, format!(" {word}")),
        None => ("", format!(" {text}")),
    }
}

/// lm-eval `_encode_pair`: trailing spaces of the context move to the target, then the
/// target's tokens are whatever tokenizing the whole adds after the context's tokens.
pub fn encode_pair(
    tok: &TextTokenizer,
    context: &str,
    target: &str,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let trimmed = context.trim_end_matches(' ');
    let target = format!("{}{target}", &context[trimmed.len()..]);
    let whole = tok.encode(&format!("{trimmed}{target}"))?;
    let ctx = tok.encode(trimmed)?;
    let cont = whole.get(ctx.len()..).unwrap_or_default().to_vec();
    Ok((ctx, cont))
}

pub fn build_request(
    tok: &TextTokenizer,
    index: usize,
    text: &str,
    max_len: usize,
) -> Result<Request> {
    let (context, target) = split_passage(text);
    let (context_tokens, target_tokens) = encode_pair(tok, context, &target)?;
    if target_tokens.is_empty() || target_tokens.len() > max_len {
        return Err(Error::Config(format!(
            "passage {index}: target '{target}' has {} tokens; the model takes 1..={max_len}",
            target_tokens.len()
        )));
    }
    let all: Vec<u32> = context_tokens
        .iter()
        .chain(&target_tokens)
        .copied()
        .collect();
    let start = all.len().saturating_sub(max_len + 1);
    let input = all[start..all.len() - 1].to_vec();
    Ok(Request {
        index,
        context_tokens,
        target_tokens,
        input,
    })
}

pub fn build_requests(
    tok: &TextTokenizer,
    passages: &[(usize, String)],
    max_len: usize,
) -> Result<Vec<Request>> {
    passages
        .iter()
        .map(|(i, text)| build_request(tok, *i, text, max_len))
        .collect()
}

/// Shapes of one batch.
pub struct BatchShape {
    /// Real input tokens.
    pub n_tokens: usize,
    /// The longest input (the batch is right-padded to at least this).
    pub longest: usize,
}

pub fn batch_shape(batch: &[Request]) -> BatchShape {
    BatchShape {
        n_tokens: batch.iter().map(|r| r.input.len()).sum(),
        longest: batch.iter().map(|r| r.input.len()).max().unwrap_or(0),
    }
}

/// Per-passage results from per-token scores: the metric code every engine shares.
/// ll = Σ log p(target tokens) (summed in f64); greedy = every target token is the argmax.
pub fn passage_results(batch: &[Request], scores: &TargetScores) -> Result<Vec<PassageResult>> {
    let n_targets: usize = batch.iter().map(|r| r.target_tokens.len()).sum();
    if scores.token_ll.len() != n_targets || scores.argmax.len() != n_targets {
        return Err(Error::Config(format!(
            "engine returned {} log-probs and {} argmax ids for {n_targets} target tokens",
            scores.token_ll.len(),
            scores.argmax.len()
        )));
    }
    let mut k = 0;
    let mut out = Vec::with_capacity(batch.len());
    for r in batch {
        let n = r.target_tokens.len();
        out.push(PassageResult {
            index: r.index,
            ll: scores.token_ll[k..k + n].iter().map(|&x| x as f64).sum(),
            greedy: scores.argmax[k..k + n] == r.target_tokens[..],
            n_context_tokens: r.context_tokens.len(),
            n_target_tokens: n,
        });
        k += n;
    }
    Ok(out)
}

/// Scores one batch with a candle model, padded to its longest input.
pub fn score_batch(
    model: &dyn CausalLm,
    batch: &[Request],
    device: &Device,
) -> Result<Vec<PassageResult>> {
    let longest = batch_shape(batch).longest;
    passage_results(batch, &target_scores(model, batch, longest, device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_at_the_last_space_like_lm_eval() {
        assert_eq!(
            split_passage("he said hello there"),
            ("he said hello", " there".to_string())
        );
        // split(" ") semantics: a double space leaves an empty-word-free target, context keeps its space.
        assert_eq!(split_passage("a  b"), ("a ", " b".to_string()));
    }

    #[test]
    fn trailing_context_spaces_move_to_the_target() {
        let tok = TextTokenizer::gpt2().unwrap();
        let (ctx, cont) = encode_pair(&tok, "a ", " b").unwrap();
        assert_eq!(ctx, tok.encode("a").unwrap());
        assert_eq!([ctx, cont].concat(), tok.encode("a  b").unwrap());
    }

    #[test]
    fn long_inputs_are_cut_on_the_left_and_drop_the_last_token() {
        let tok = TextTokenizer::gpt2().unwrap();
        let text = "one two three four five six seven eight nine ten";
        let full = build_request(&tok, 0, text, 1024).unwrap();
        let all: Vec<u32> = [full.context_tokens.clone(), full.target_tokens.clone()].concat();
        assert_eq!(full.input, all[..all.len() - 1]);
        let cut = build_request(&tok, 0, text, 4).unwrap();
        assert_eq!(cut.input, all[all.len() - 5..all.len() - 1]);
        assert_eq!(cut.target_tokens, full.target_tokens);
    }
}
