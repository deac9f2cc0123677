//! The training step's residual adds in 16-byte vectors (`--fused residual`; kernel in
//! residual.cu): candle's add of two contiguous tensors moves 2 bytes a thread, at about a
//! third of the bandwidth (docs/perf-notes.md). Shapes: a, b and the sum of one shape.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// a + b (one shape and float dtype, contiguous), the sum in f32 rounded once. None where it
/// does not apply (CPU, switched off, shapes or dtypes that differ, not whole 16-byte vectors).
pub fn residual_add(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Residual) {
        return Ok(None);
    }
    imp::residual_add(a, b)
}

/// The CPU runs candle's add.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn residual_add(_: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::launch::{
        aligned16, alloc, flat_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, view,
        with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
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

    pub fn residual_add(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
        let whole = (a.elem_count() * a.dtype().size_in_bytes()).is_multiple_of(16);
        let same = a.dims() == b.dims() && a.dtype() == b.dtype();
        if !a.device().is_cuda()
            || !float_dtype(a)
            || !same
            || !whole
            || !aligned16(a)
            || !aligned16(b)
        {
            return Ok(None);
        }
        Ok(Some(a.apply_op2_no_bwd(b, &Add)?))
    }
}
