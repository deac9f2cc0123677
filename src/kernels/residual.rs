//! The training step's residual adds in 16-byte vectors (`--fused residual`; kernel in
//! residual.cu): candle's add of two contiguous tensors moves 2 bytes a thread, at about a
//! third of the bandwidth (docs/perf-notes.md). The residual branch's hashed dropout can ride
//! along: a + dropout(b) in the forward, (a + b, dropout(a + b)) in the backward, one pass each
//! instead of two. Shapes: a, b and the sums of one shape.

use super::{enabled, Fused, Keep};
use candle_core::{Result, Tensor};

/// a + b (one shape and float dtype, contiguous), the sum in f32 rounded once. None where it
/// does not apply (CPU, switched off, shapes or dtypes that differ, not whole 16-byte vectors).
pub fn residual_add(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Residual) {
        return Ok(None);
    }
    imp::residual_add(a, b)
}

/// a + b ⊙ keep / (1 − p), rounded as [`super::apply_keep`] then [`residual_add`] round. None
/// where the add does not apply or the mask is stored.
pub fn residual_add_dropped(a: &Tensor, b: &Tensor, keep: &Keep, p: f32) -> Result<Option<Tensor>> {
    match keep {
        Keep::Hash(key) if enabled(Fused::Residual) => imp::add_drop(a, b, *key, p, false),
        _ => Ok(None),
    }
}

/// (a + b, (a + b) ⊙ keep / (1 − p)): the backward of [`residual_add_dropped`]'s neighbour, a
/// gradient's sum and the dropout branch's gradient in one pass. None as above.
pub fn residual_add_then_drop(
    a: &Tensor,
    b: &Tensor,
    keep: &Keep,
    p: f32,
) -> Result<Option<(Tensor, Tensor)>> {
    let Keep::Hash(key) = keep else {
        return Ok(None);
    };
    if !enabled(Fused::Residual) {
        return Ok(None);
    }
    let Some(both) = imp::add_drop(a, b, *key, p, true)? else {
        return Ok(None);
    };
    Ok(Some((both.get(0)?, both.get(1)?)))
}

/// The CPU runs candle's add.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn residual_add(_: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn add_drop(_: &Tensor, _: &Tensor, _: u64, _: f32, _: bool) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::dropout::imp::threshold;
    use crate::kernels::launch::{
        aligned16, alloc, flat_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, view,
        with_dtype, Ptx, NULL,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{CudaStorage, CustomOp2, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("residual");

    struct Add;

    impl CustomOp2 for Add {
        fn name(&self) -> &'static str {
            "tb-residual-add"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            a: &CudaStorage,
            al: &Layout,
            b: &CudaStorage,
            bl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = a.device().clone();
            let n = al.shape().elem_count();
            let vectors = (n * a.dtype().size_in_bytes() / 16) as i64;
            let func = kernel!(dev, PTX, "tb_add_vec", a.dtype())?;
            with_dtype!(a.dtype(), T => {
                let (av, bv) = (view::<T>(a, al)?, view::<T>(b, bl)?);
                let out = alloc::<T>(&dev, n)?;
                // SAFETY: a, b and out hold n elements, whole 16-byte vectors from aligned
                // starts (checked by residual_add).
                launch!(unsafe func, flat_config(vectors as usize); &av, &bv, &out, &vectors)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), al.shape().clone()))
            })
        }
    }

    /// a + keep(b), or with `both` (2, ..) = [a + b, keep(a + b)]: the dropout's key, its
    /// threshold and 1 / (1 − p).
    struct AddDrop {
        key: u64,
        thresh: u32,
        scale: f32,
        both: bool,
    }

    impl CustomOp2 for AddDrop {
        fn name(&self) -> &'static str {
            "tb-residual-add-dropout"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            a: &CudaStorage,
            al: &Layout,
            b: &CudaStorage,
            bl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = a.device().clone();
            let n = al.shape().elem_count();
            let vectors = (n * a.dtype().size_in_bytes() / 16) as i64;
            let func = kernel!(dev, PTX, "tb_add_drop_vec", a.dtype())?;
            let (key, thresh, scale) = (self.key, self.thresh, self.scale);
            with_dtype!(a.dtype(), T => {
                let (av, bv) = (view::<T>(a, al)?, view::<T>(b, bl)?);
                let out = alloc::<T>(&dev, if self.both { 2 * n } else { n })?;
                let dropped = out.slice(n..);
                // The optional output pushed by hand, not by `launch!`.
                let mut launch = func.builder();
                launch.arg(&av).arg(&bv).arg(&out);
                if self.both {
                    launch.arg(&dropped);
                } else {
                    launch.arg(&NULL);
                }
                launch.arg(&vectors).arg(&key).arg(&thresh).arg(&scale);
                // SAFETY: a, b and each output half hold n elements, whole 16-byte vectors
                // from aligned starts (checked by `usable`).
                unsafe { launch.launch(flat_config(vectors as usize)) }.w()?;
                let mut dims = al.dims().to_vec();
                if self.both {
                    dims.insert(0, 2);
                }
                let shape = Shape::from(dims);
                Ok((CudaStorage::wrap_cuda_slice(out, dev), shape))
            })
        }
    }

    /// Both tensors on CUDA, one float dtype and shape, whole 16-byte vectors, aligned.
    fn usable(a: &Tensor, b: &Tensor) -> bool {
        let whole = (a.elem_count() * a.dtype().size_in_bytes()).is_multiple_of(16);
        let same = a.dims() == b.dims() && a.dtype() == b.dtype();
        a.device().is_cuda() && float_dtype(a) && same && whole && aligned16(a) && aligned16(b)
    }

    pub fn residual_add(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
        if !usable(a, b) {
            return Ok(None);
        }
        Ok(Some(a.apply_op2_no_bwd(b, &Add)?))
    }

    pub fn add_drop(
        a: &Tensor,
        b: &Tensor,
        key: u64,
        p: f32,
        both: bool,
    ) -> Result<Option<Tensor>> {
        if !usable(a, b) {
            return Ok(None);
        }
        let op = AddDrop {
            key,
            thresh: threshold(p),
            scale: 1. / (1. - p),
            both,
        };
        Ok(Some(a.apply_op2_no_bwd(b, &op)?))
    }
}
