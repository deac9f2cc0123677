//! The candle engine's LAMBADA scoring: one forward pass over a right-padded batch, the LM
//! head only on the rows that predict target tokens, log-softmax in fp32.

use super::CandleEngine;
use crate::engines::{BatchOutput, Request, Score, TargetScores};
use crate::error::Result;
use crate::models::attention::log_softmax_f32;
use crate::models::CausalLm;
use crate::trackers::LatencyTracker;
use candle_core::{DType, Device, Tensor};

/// One forward pass of a candle model over a batch right-padded to `padded_len` positions
/// (at least its longest input), the LM head only on the rows that predict target tokens.
pub fn target_scores(
    model: &dyn CausalLm,
    batch: &[Request],
    padded_len: usize,
    device: &Device,
) -> Result<TargetScores> {
    let longest = batch.iter().map(|r| r.input.len()).max().unwrap_or(0);
    let (b, t) = (batch.len(), longest.max(padded_len));
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

impl Score for CandleEngine {
    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn score(&mut self, batch: &[Request], padded_len: usize) -> Result<BatchOutput> {
        let _profiled = crate::profile::window(&self.device);
        let mut timer = LatencyTracker::new(&self.device);
        timer.start()?;
        let scores = target_scores(self.model.as_ref(), batch, padded_len, &self.device)?;
        Ok(BatchOutput {
            scores,
            latency_ms: timer.stop_ms()?,
        })
    }
}
