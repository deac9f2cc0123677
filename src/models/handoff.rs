//! Custom ops whose forward result is computed beforehand with ordinary (detached) tensor
//! ops and handed to candle when the op is applied. This lets an op choose what autograd keeps
//! for its backward (only the op's inputs), where the composed ops would keep every
//! intermediate: see `attention::recomputed_attention` and `loss::cross_entropy_rows`.

use candle_core::{CpuStorage, CudaStorage, Result, Shape, Storage, Tensor};
use std::sync::Mutex;

/// A tensor waiting to become a custom op's output; taken once, by the op's forward.
#[derive(Default)]
pub struct Handoff(Mutex<Option<Tensor>>);

impl Handoff {
    pub fn put(&self, t: Tensor) {
        *self.0.lock().expect("handoff lock") = Some(t);
    }

    fn take(&self) -> Result<(Storage, Shape)> {
        let t = self
            .0
            .lock()
            .expect("handoff lock")
            .take()
            .ok_or_else(|| candle_core::Error::Msg("custom op output taken twice".into()))?;
        let t = t.contiguous()?;
        let (storage, layout) = t.storage_and_layout();
        // A copy: the storage may be shared with other tensors (and may start at an offset).
        Ok((storage.try_clone(layout)?, layout.shape().clone()))
    }

    pub fn take_cpu(&self) -> Result<(CpuStorage, Shape)> {
        match self.take()? {
            (Storage::Cpu(s), shape) => Ok((s, shape)),
            _ => candle_core::bail!("custom op: precomputed output is not on the CPU"),
        }
    }

    pub fn take_cuda(&self) -> Result<(CudaStorage, Shape)> {
        match self.take()? {
            (Storage::Cuda(s), shape) => Ok((s, shape)),
            _ => candle_core::bail!("custom op: precomputed output is not on the GPU"),
        }
    }
}
