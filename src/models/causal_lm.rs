//! The model interface the suites see ([`CausalLm`]), apart from the models' specs (mod.rs)
//! so that the models implement it without importing the module that names them.

use super::cache::KvCache;
use candle_core::Tensor;

/// What a suite needs from a causal language model.
pub trait CausalLm {
    /// Final hidden states (after the last norm). input_ids: (B, T) u32; attention_mask:
    /// (B, T) u32, 1 for real tokens, 0 for right padding. Returns (B, T, C).
    fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle_core::Result<Tensor>;

    /// [`CausalLm::hidden_states`] of sequences packed end to end without padding: input_ids
    /// (1, N) u32, `lens` the sequences' lengths (summing to N). Returns (1, N, C), or None
    /// where the model has no packed forward (training mode, or the fused attention does not
    /// apply: [`crate::kernels::prefill_applies`]); the caller pads instead.
    fn hidden_states_packed(
        &self,
        input_ids: &Tensor,
        lens: &[usize],
    ) -> candle_core::Result<Option<Tensor>> {
        let _ = (input_ids, lens);
        Ok(None)
    }

    /// LM-head logits of selected hidden states: (N, C) -> (N, V). Kept apart from
    /// [`CausalLm::hidden_states`] so that scoring computes only the rows it reads.
    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor>;

    /// [`CausalLm::logits`] with the vocabulary padded by zero rows of the head to a multiple
    /// of `multiple`: (N, C) -> ((N, V'), V) with V' ≥ V; the extra columns are 0 and not
    /// part of the vocabulary. cuBLAS takes its fast kernels only for aligned leading
    /// dimensions, which GPT-2's V = 50257 is not. Default: no padding.
    fn logits_padded(
        &self,
        hidden: &Tensor,
        multiple: usize,
    ) -> candle_core::Result<(Tensor, usize)> {
        let _ = multiple;
        let logits = self.logits(hidden)?;
        let v = logits.dim(1)?;
        Ok((logits, v))
    }

    /// Longest sequence the model accepts.
    fn max_positions(&self) -> usize;

    /// A KV cache for [`CausalLm::forward_cached`]: `batch` rows of up to `max_len` positions,
    /// every layer of this model (under tensor parallelism: this rank's heads), in its dtype on
    /// its device.
    fn new_cache(&self, batch: usize, max_len: usize) -> candle_core::Result<KvCache>;

    /// The next T positions of every row through the model, attending the positions already
    /// in `cache` and writing their own keys and values into it (in place): the prefill is
    /// the prompt into an empty cache, a decode step one token. input_ids: (B, T) u32;
    /// attention_mask: (B, T) u32 of the new positions, 1 real token, 0 (left) padding; the
    /// cache carries the mask of the earlier ones. Returns the logits of the last position,
    /// (B, V). Always the inference path (no dropout), whatever [`CausalLm::set_training`] said.
    fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> candle_core::Result<Tensor>;

    /// [`CausalLm::forward_cached`] of left-padded prompts into an empty cache, only their
    /// real tokens through the layers, end to end (the fused attention, `--fused prefill`).
    /// input_ids: (B, T) u32, row b's last `lens[b]` real (padding first: the lengths, not
    /// the pad ids, say where). The cache ends as the padded forward leaves it (mask,
    /// positions, the real tokens' keys and values), but its padding columns hold zeros.
    /// Returns the last positions' logits (B, V), or None where there is no packed prefill
    /// (fp32, the CPU, `--fused` without prefill, head sizes but 64 and 128, a cache that is
    /// not empty, GPT-2's T past n_positions): the caller runs forward_cached.
    fn prefill_packed(
        &self,
        input_ids: &Tensor,
        lens: &[usize],
        cache: &mut KvCache,
    ) -> candle_core::Result<Option<Tensor>> {
        let _ = (input_ids, lens, cache);
        Ok(None)
    }

    /// Whether a decode step's launches can be recorded as a CUDA graph: not under tensor
    /// parallelism whose all-reduce goes through the host (TCP); NCCL's can be recorded.
    fn graph_capturable(&self) -> bool {
        false
    }

    /// Stores the projections' and the LM head's weights as fp8 (`--dtype fp8`,
    /// [`super::fp8`]); inference only, after loading. Default: not built for this model.
    fn quantize_fp8(&mut self) -> candle_core::Result<()> {
        candle_core::bail!("fp8 weights are not built for this model")
    }

    /// Lays the projections' weights out for decoding, inference only: GPT-2's Conv1D (in,
    /// out) weights as nn.Linear's (out, in), so that a decode step's 1–4 rows take the GEMV
    /// (`--fused gemv`) and 5–16 rows the tensor-core kernel (`--fused skinny-proj`) instead of
    /// cuBLAS's small-M kernels (the matmuls read either layout; the candle engine calls it
    /// before its first such generation). Default: nothing to do.
    fn prepare_decode(&mut self) -> candle_core::Result<()> {
        Ok(())
    }

    /// Folds each block's LayerNorms into the projections after them for decode steps of
    /// `rows` rows (`--fused norm-fold`, [`super::norm_fold`]), after
    /// [`CausalLm::prepare_decode`], where such a step takes them ([`super::norm_fold::folds`]);
    /// the same function on every path, rounded differently where γ ≠ 1 or β ≠ 0. Once;
    /// inference only. Default: nothing to fold.
    fn fold_norms(&mut self, _rows: usize) -> candle_core::Result<()> {
        Ok(())
    }

    /// Switches to training: differentiable ops everywhere and, `with_dropout`, the config's
    /// dropout (see [`super::layers::Mode`]). Models start in inference mode.
    fn set_training(&mut self, with_dropout: bool);
}
