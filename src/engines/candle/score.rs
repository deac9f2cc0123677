//! The candle engine's LAMBADA scoring: one forward pass over the batch, the LM head only on
//! the rows that predict target tokens, log-softmax in fp32. Where the model has a packed
//! forward (the fused attention, `--fused prefill`) the passages run end to end without
//! padding, as FasterTransformer's "remove padding"; else right-padded to `padded_len`.

use super::CandleEngine;
use crate::engines::{BatchOutput, Request, Score, TargetScores};
use crate::error::Result;
use crate::models::attention::log_softmax_f32;
use crate::models::CausalLm;
use crate::trackers::LatencyTracker;
use candle_core::{DType, Device, Tensor};

/// The hidden states of a batch as rows (R, C), the rows whose logits predict target tokens,
/// and those targets.
struct Picked {
    hidden: Tensor,
    rows: Vec<u32>,
    targets: Vec<u32>,
}

/// One forward pass of a candle model over a batch (packed where the model can, else
/// right-padded to `padded_len` positions, at least its longest input), the LM head only on
/// the rows that predict target tokens.
pub fn target_scores(
    model: &dyn CausalLm,
    batch: &[Request],
    padded_len: usize,
    device: &Device,
) -> Result<TargetScores> {
    let picked = match packed_forward(model, batch, device)? {
        Some(p) => p,
        None => padded_forward(model, batch, padded_len, device)?,
    };
    let n_rows = picked.rows.len();
    let rows = Tensor::from_vec(picked.rows, n_rows, device)?;
    let picked_hidden = picked.hidden.index_select(&rows, 0)?; // (N, C)
    let logp = log_softmax_f32(&model.logits(&picked_hidden)?)?; // (N, V) f32
    let targets = Tensor::from_vec(picked.targets, (n_rows, 1), device)?;
    Ok(TargetScores {
        token_ll: logp.gather(&targets, 1)?.flatten_all()?.to_vec1()?,
        argmax: logp
            .argmax_keepdim(1)?
            .flatten_all()?
            .to_dtype(DType::U32)?
            .to_vec1()?,
    })
}

/// The rows of request `r` whose logits predict its targets, its inputs starting at row
/// `at`: input[first − 1] predicts target[0].
fn target_rows(r: &Request, at: usize) -> impl Iterator<Item = u32> {
    let (n, first) = (r.input.len(), r.input.len() + 1 - r.target_tokens.len());
    (first - 1..n).map(move |p| (at + p) as u32)
}

/// The batch's inputs end to end, (1, N), through the model's packed forward; None where it
/// has none.
fn packed_forward(
    model: &dyn CausalLm,
    batch: &[Request],
    device: &Device,
) -> Result<Option<Picked>> {
    let lens: Vec<usize> = batch.iter().map(|r| r.input.len()).collect();
    let ids: Vec<u32> = batch.iter().flat_map(|r| r.input.iter().copied()).collect();
    let n = ids.len();
    let ids = Tensor::from_vec(ids, (1, n), device)?;
    let Some(hidden) = model.hidden_states_packed(&ids, &lens)? else {
        return Ok(None);
    };
    let starts = lens.iter().scan(0, |row, &n| {
        *row += n;
        Some(*row - n)
    });
    let rows = batch
        .iter()
        .zip(starts)
        .flat_map(|(r, at)| target_rows(r, at));
    Ok(Some(Picked {
        hidden: hidden.squeeze(0)?, // (N, C)
        rows: rows.collect(),
        targets: batch.iter().flat_map(|r| r.target_tokens.clone()).collect(),
    }))
}

/// The batch right-padded to `padded_len` (at least its longest input), (B, T).
fn padded_forward(
    model: &dyn CausalLm,
    batch: &[Request],
    padded_len: usize,
    device: &Device,
) -> Result<Picked> {
    let longest = batch.iter().map(|r| r.input.len()).max().unwrap_or(0);
    let (b, t) = (batch.len(), longest.max(padded_len));
    let mut ids = vec![0u32; b * t];
    let mut mask = vec![0u32; b * t];
    for (i, r) in batch.iter().enumerate() {
        let n = r.input.len();
        ids[i * t..i * t + n].copy_from_slice(&r.input);
        mask[i * t..i * t + n].fill(1);
    }
    let ids = Tensor::from_vec(ids, (b, t), device)?;
    let mask = Tensor::from_vec(mask, (b, t), device)?;
    let hidden = model.hidden_states(&ids, &mask)?; // (B, T, C)
    let c = hidden.dim(2)?;
    let rows = batch
        .iter()
        .enumerate()
        .flat_map(|(i, r)| target_rows(r, i * t));
    Ok(Picked {
        hidden: hidden.reshape((b * t, c))?, // (B·T, C)
        rows: rows.collect(),
        targets: batch.iter().flat_map(|r| r.target_tokens.clone()).collect(),
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
