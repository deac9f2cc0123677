//! A decode step's blocks as one persistent kernel (`--fused step`, [`kernels::StepModel`]):
//! the weights GPT-2 and BLOOM hand it, gathered once a model at its first decode step.

use super::cache::{KvCache, Step};
use super::layers::{Activation, Mlp, Norm, Projection};
use crate::kernels::{self, Fused, StepLayer, StepModel};
use candle_core::{Result, Tensor};
use std::sync::OnceLock;

/// The kernel of one model, built at its first decode step (None where it does not apply).
#[derive(Default)]
pub struct StepKernel(OnceLock<Option<StepModel>>);

impl StepKernel {
    /// LN_f of the blocks over `x()` (B, 1, C), the residual stream entering layer 0, whose
    /// new keys and values go into `cache`'s `n_layer` layers: (B, 1, C). None where the kernel
    /// does not apply (prefill, more rows, the path off): the caller runs its layers.
    pub fn forward(
        &self,
        x: impl FnOnce() -> Result<Tensor>,
        cache: &KvCache,
        step: &Step,
        n_layer: usize,
        build: impl FnOnce() -> Result<Option<StepModel>>,
    ) -> Result<Option<Tensor>> {
        let rows = cache.batch() <= kernels::STEP_MAX_ROWS;
        if step.t != 1 || !rows || !kernels::enabled(Fused::Step) || !cache.device().is_cuda() {
            return Ok(None);
        }
        if self.0.get().is_none() {
            let _ = self.0.set(build()?);
        }
        let Some(kernel) = self.0.get().and_then(Option::as_ref) else {
            return Ok(None);
        };
        if !kernel.applies(cache.batch(), cache.max_len()) {
            return Ok(None);
        }
        let slots = (0..n_layer)
            .map(|i| cache.layer_step(i, step).map(|s| s.slot()))
            .collect::<Result<Vec<_>>>()?;
        kernel.forward(&x()?, &slots)
    }
}

/// One pre-LayerNorm block's weights for the kernel: None where a projection is not dense and
/// whole (fp8, tensor-parallel), a norm has no bias, or the MLP's activation is not the tanh
/// GELU. GPT-2's Conv1D weights are copied as nn.Linear's (out, in).
pub fn step_layer(
    ln1: &Norm,
    qkv: &Projection,
    proj: &Projection,
    ln2: &Norm,
    mlp: &Mlp,
) -> Result<Option<StepLayer>> {
    if mlp.act != Activation::GeluTanh {
        return Ok(None);
    }
    let parts = (
        ln1.parts(),
        qkv.linear_parts()?,
        proj.linear_parts()?,
        ln2.parts(),
        mlp.up.linear_parts()?,
        mlp.down.linear_parts()?,
    );
    let (Some(ln1), Some(qkv), Some(proj), Some(ln2), Some(fc), Some(fc2)) = parts else {
        return Ok(None);
    };
    Ok(Some(StepLayer {
        ln1,
        qkv,
        proj,
        ln2,
        fc,
        fc2,
    }))
}
