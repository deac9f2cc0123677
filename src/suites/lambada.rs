//! LAMBADA last-word prediction, scored exactly like lm-evaluation-harness `lambada_openai`.
//!
//! Per passage: context = the text before its last space, target = " " + last word.
//! Tokens as lm-eval's `HFLM._encode_pair`: whole = tok(context + target), ctx = tok(context),
//! target tokens = whole[len(ctx)..]. The model reads (ctx + target)[-(max_len + 1)..][..-1];
//! the passage's log-likelihood is the sum of log p(target token) at the target positions, and
//! it is `greedy` when every target token is the argmax. Metrics: [`crate::metrics`].
//!
//! Batches keep file order and are right-padded to their longest row; with a causal mask no
//! real token ever sees padding, so results do not depend on the batch size.

use crate::error::{Error, Result};
use crate::models::attention::log_softmax_f32;
use crate::models::CausalLm;
use crate::record::PassageResult;
use crate::tokenizer::TextTokenizer;
use candle_core::{DType, Device, Tensor};

/// One tokenized passage, ready to batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Line index in the data file.
    pub index: usize,
    pub context_tokens: Vec<u32>,
    pub target_tokens: Vec<u32>,
    /// What the model reads: (context + target) truncated on the left, minus the last token.
    pub input: Vec<u32>,
}

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

/// Shapes of one padded batch.
pub struct BatchShape {
    pub n_tokens: usize,
    pub padded_len: usize,
}

pub fn batch_shape(batch: &[Request]) -> BatchShape {
    BatchShape {
        n_tokens: batch.iter().map(|r| r.input.len()).sum(),
        padded_len: batch.iter().map(|r| r.input.len()).max().unwrap_or(0),
    }
}

/// What an engine returns for a batch: for every passage in order, one entry per target
/// token: its log-probability (natural log, computed in fp32) and the argmax token id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetScores {
    pub token_ll: Vec<f32>,
    pub argmax: Vec<u32>,
}

/// One forward pass of a candle model over a right-padded batch, the LM head only on the
/// rows that predict target tokens.
pub fn target_scores(
    model: &dyn CausalLm,
    batch: &[Request],
    device: &Device,
) -> Result<TargetScores> {
    let (b, t) = (batch.len(), batch_shape(batch).padded_len);
    let mut ids = vec![0u32; b * t];
    let mut mask = vec![0u32; b * t];
    // Rows of the flattened (B·T) hidden states whose logits predict target tokens.
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (i, r) in batch.iter().enumerate() {
        let n = r.input.len();
        ids[i * t..i * t + n].copy_from_slice(&r.input);
        mask[i * t..i * t + n].fill(1);
        let first = n + 1 - r.target_tokens.len(); // input[first - 1] predicts target[0]
        rows.extend((first - 1..n).map(|p| (i * t + p) as u32));
        targets.extend_from_slice(&r.target_tokens);
    }
    let ids = Tensor::from_vec(ids, (b, t), device)?;
    let mask = Tensor::from_vec(mask, (b, t), device)?;
    let hidden = model.hidden_states(&ids, &mask)?; // (B, T, C)
    let c = hidden.dim(2)?;
    let n_rows = rows.len();
    let rows = Tensor::from_vec(rows, n_rows, device)?;
    let picked = hidden.reshape((b * t, c))?.index_select(&rows, 0)?; // (N, C)
    let logp = log_softmax_f32(&model.logits(&picked)?)?; // (N, V) f32
    let targets = Tensor::from_vec(targets, (n_rows, 1), device)?;
    Ok(TargetScores {
        token_ll: logp.gather(&targets, 1)?.flatten_all()?.to_vec1()?,
        argmax: logp
            .argmax_keepdim(1)?
            .flatten_all()?
            .to_dtype(DType::U32)?
            .to_vec1()?,
    })
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

/// Scores one batch with a candle model.
pub fn score_batch(
    model: &dyn CausalLm,
    batch: &[Request],
    device: &Device,
) -> Result<Vec<PassageResult>> {
    passage_results(batch, &target_scores(model, batch, device)?)
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
