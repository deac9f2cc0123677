//! One rank of a data-parallel group ([`DataParallel`]): gradients summed over the ranks in
//! buckets (one collective a bucket), or started block by block under the manual backward
//! (`--dp-overlap`), and ZeRO-1's owner of each parameter.

use super::clock::{CommClock, CommSpan};
use super::zero::ZeroStage;
use crate::dist::AllReduce;
use candle_core::{DType, Device, Result, Tensor};
use std::sync::Arc;

/// Gradients summed in buckets of at most this many values: one collective per bucket, not per
/// tensor (torch DDP's default bucket is 25 MiB; ours holds 32 Mi fp32 values, 128 MiB).
const BUCKET: usize = 1 << 25;

/// `tensors` in one fresh f32 bucket (a buffer of its own: NCCL sums over it in place), and
/// where each starts: on CUDA one pass that casts as it copies (`kernels::cast_multi_flat`),
/// else each cast, then concatenated.
fn bucket(tensors: &[Tensor]) -> Result<(Tensor, Vec<usize>)> {
    if let Some(b) = crate::kernels::cast_multi_flat(tensors, DType::F32)? {
        return Ok(b);
    }
    let flat = tensors
        .iter()
        .map(|t| t.to_dtype(DType::F32)?.flatten_all())
        .collect::<Result<Vec<_>>>()?;
    let starts = tensors
        .iter()
        .scan(0, |at, t| {
            *at += t.elem_count();
            Some(*at - t.elem_count())
        })
        .collect();
    // cat hands a lone tensor back as it is: copy it, so the sum leaves the input alone.
    let buffer = match flat.len() {
        1 => flat[0].copy()?,
        _ => Tensor::cat(&flat, 0)?,
    };
    Ok((buffer, starts))
}

/// Each of `tensors`' shape over its run of `sum`, the bucket they were copied into.
fn views(sum: &Tensor, tensors: &[Tensor], starts: &[usize]) -> Result<Vec<Tensor>> {
    let views = tensors
        .iter()
        .zip(starts)
        .map(|(t, &at)| sum.narrow(0, at, t.elem_count())?.reshape(t.shape()));
    views.collect()
}

/// This rank of a data-parallel group.
pub struct DataParallel {
    pub rank: usize,
    pub size: usize,
    pub reduce: Arc<dyn AllReduce>,
    /// What the ranks split (`--zero`).
    pub zero: ZeroStage,
    /// Start each block's all-reduce in the manual backward (`--dp-overlap`).
    pub overlap: bool,
}

impl DataParallel {
    /// Starts summing `tensors` over the ranks as one bucket, in f32 (one buffer, one
    /// collective): what it returns holds the sums once [`DataParallel::wait`] is called.
    pub(super) fn start(&self, tensors: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let (buffer, starts) = bucket(&tensors)?;
        views(&self.reduce.start_sum(buffer)?, &tensors, &starts)
    }

    /// Orders the device's work queued next after every started sum.
    pub(super) fn wait(&self) -> Result<()> {
        self.reduce.wait_sums()
    }

    /// Sums `tensors` (f32) over the ranks, in buckets, on the device's stream (NCCL on a
    /// stream of its own, as [`DataParallel::start`] runs it, measured 5–7 % slower at dp 2
    /// on 2× H200 when it does not overlap anything: results/h200/overlap-run3).
    pub(super) fn all_reduce(&self, tensors: &mut [Tensor]) -> Result<()> {
        let mut start = 0;
        while start < tensors.len() {
            let mut end = start;
            let mut n = 0;
            while end < tensors.len() && (end == start || n + tensors[end].elem_count() <= BUCKET) {
                n += tensors[end].elem_count();
                end += 1;
            }
            let run = &mut tensors[start..end];
            let (buffer, starts) = bucket(run)?;
            let sums = views(&self.reduce.all_reduce_sum(&buffer)?, run, &starts)?;
            run.clone_from_slice(&sums);
            start = end;
        }
        Ok(())
    }

    /// A step's sum over the ranks, each rank's gradients already divided by the number of
    /// ranks (so the sum is the mean): `grads` summed in place, `loss_sum` riding along; with
    /// `overlapped` (the gradients' sums started in the backward) only the loss's is started
    /// here. Returns the summed loss and the time the collectives took on `device` (with
    /// overlap, the wait left after the backward).
    pub(super) fn sum_step(
        &self,
        grads: &mut Vec<Tensor>,
        loss_sum: Tensor,
        overlapped: bool,
        device: &Device,
    ) -> Result<(Tensor, CommSpan)> {
        let clock = CommClock::start(device)?;
        let loss_sum = match overlapped {
            true => self.start(vec![loss_sum])?.remove(0),
            false => {
                grads.push(loss_sum);
                self.all_reduce(grads)?;
                grads.pop().expect("the loss")
            }
        };
        self.wait()?;
        Ok((loss_sum, clock.stop(device)?))
    }

    /// ZeRO-1 owner of each of `sizes` (parameter element counts): contiguous runs of
    /// parameters, about equal in elements.
    pub fn owners(sizes: &[usize], ranks: usize) -> Vec<usize> {
        let total: usize = sizes.iter().sum();
        let mut before = 0;
        sizes
            .iter()
            .map(|&n| {
                // The rank whose equal share holds this parameter's middle element.
                let mid = before + n / 2;
                before += n;
                (mid * ranks / total.max(1)).min(ranks - 1)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Sums in place as NCCL's started sums do: a group of two identical ranks, so the sum is
    /// the tensor doubled, written over the buffer it is given.
    struct DoubleInPlace;

    impl candle_core::InplaceOp1 for DoubleInPlace {
        fn name(&self) -> &'static str {
            "double-in-place"
        }

        fn cpu_fwd(&self, s: &mut candle_core::CpuStorage, _: &candle_core::Layout) -> Result<()> {
            match s {
                candle_core::CpuStorage::F32(v) => v.iter_mut().for_each(|x| *x *= 2.),
                _ => candle_core::bail!("f32 only"),
            }
            Ok(())
        }
    }

    impl AllReduce for DoubleInPlace {
        fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
            x * 2.
        }

        fn start_sum(&self, x: Tensor) -> Result<Tensor> {
            x.inplace_op1(&DoubleInPlace)?;
            Ok(x)
        }

        fn describe(&self) -> String {
            "double".into()
        }
    }

    /// An in-place sum never writes over the tensors it was given (a bucket of one tensor
    /// included, which `Tensor::cat` would hand back as it is), so ZeRO-1 can set each
    /// parameter from the sum of its own value.
    #[test]
    fn started_sums_leave_their_inputs_alone() -> Result<()> {
        let dp = DataParallel {
            rank: 0,
            size: 2,
            reduce: Arc::new(DoubleInPlace),
            zero: ZeroStage::Optimizer,
            overlap: false,
        };
        let big = Var::from_tensor(&Tensor::ones(BUCKET + 1, DType::F32, &Device::Cpu)?)?;
        let small = Tensor::arange(0f32, 6., &Device::Cpu)?.reshape((2, 3))?;
        let mut shared = vec![big.as_detached_tensor(), small.clone()];
        dp.all_reduce(&mut shared)?;
        big.set(&shared[0])?;
        assert_eq!(big.max_all()?.to_scalar::<f32>()?, 2.);
        assert_eq!(shared[1].to_vec2::<f32>()?, [[0., 2., 4.], [6., 8., 10.]]);
        assert_eq!(small.to_vec2::<f32>()?, [[0., 1., 2.], [3., 4., 5.]]);
        let bf16 = vec![
            small.to_dtype(DType::BF16)?,
            Tensor::ones(3, DType::F32, &Device::Cpu)?,
        ];
        let sums = dp.start(bf16)?;
        let lone = dp.start(vec![big.as_detached_tensor()])?;
        dp.wait()?;
        assert_eq!(lone[0].max_all()?.to_scalar::<f32>()?, 4.);
        let kept = big.max_all()?.to_scalar::<f32>()?;
        assert_eq!(kept, 2., "a lone bucket leaves its parameter alone");
        assert_eq!(sums[0].dtype(), DType::F32);
        assert_eq!(sums[1].to_vec1::<f32>()?, [2., 2., 2.]);
        Ok(())
    }
}
