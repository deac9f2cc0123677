//! Bias + activation in one pass, differentiable (`--fused bias-act`; kernels in bias_act.cu):
//! forward y = act(x + b), backward dx = dy ⊙ act'(x + b) and db = Σ_rows dx.
//!
//! Shapes: x, y, dy, dx (N, C) with C the features; b (C,). f32, bf16 or f16, one dtype.

use super::{enabled, Act, Fused};
use candle_core::{Result, Tensor};

/// act(x + b) over (N, C) in one pass, differentiable (its backward is one more fused pass and
/// a column sum for the bias).
pub fn bias_act(x: &Tensor, b: &Tensor, act: Act) -> Result<Option<Tensor>> {
    if !enabled(Fused::BiasAct) {
        return Ok(None);
    }
    imp::bias_act(x, b, act)
}

/// The backward of [`bias_act`] as its own entry point (the manual training step calls it):
/// x, dy (N, C), b (C,) -> (dx = dy ⊙ act'(x + b) (N, C), db = Σ_rows dx (C,)).
pub fn bias_act_bwd(
    x: &Tensor,
    b: &Tensor,
    dy: &Tensor,
    act: Act,
) -> Result<Option<(Tensor, Tensor)>> {
    if !enabled(Fused::BiasAct) {
        return Ok(None);
    }
    imp::bias_act_bwd(x, b, dy, act)
}

/// The CPU runs candle's broadcast add and activation.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{Result, Tensor};

    pub fn bias_act(_: &Tensor, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn bias_act_bwd(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: Act,
    ) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Act;
    use crate::kernels::launch::{
        alloc, column_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, view, with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("bias_act");

    /// y = act(x + b).
    struct BiasAct(Act);

    impl CustomOp2 for BiasAct {
        fn name(&self) -> &'static str {
            "tb-bias-act"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            b: &CudaStorage,
            bl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, n) = xl.shape().dims2()?;
            let func = kernel!(dev, PTX, "tb_bias_act_fwd", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (xv, bv) = (view::<T>(x, xl)?, view::<T>(b, bl)?);
                let out = alloc::<T>(&dev, rows * n)?;
                let (rows_i, n_i, act) = (rows as i64, n as i32, self.0.code());
                // SAFETY: x and out hold rows·n elements, b holds n.
                launch!(unsafe func, column_config(rows, n); &xv, &bv, &out, &rows_i, &n_i, &act)?;
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
        fn bwd(
            &self,
            x: &Tensor,
            b: &Tensor,
            _res: &Tensor,
            dy: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            let (dx, db) = grads(x, b, dy, self.0)?;
            Ok((Some(dx), Some(db)))
        }
    }

    /// dx = dy ⊙ act'(x + b) and db = Σ_rows dx.
    fn grads(x: &Tensor, b: &Tensor, dy: &Tensor, act: Act) -> Result<(Tensor, Tensor)> {
        let dx = match act {
            Act::None => dy.clone(),
            act => x.apply_op3_no_bwd(b, &dy.contiguous()?, &BiasActGrad(act))?,
        };
        let db = dx.sum(0)?;
        Ok((dx, db))
    }

    /// dx = dy ⊙ act'(x + b).
    struct BiasActGrad(Act);

    impl CustomOp3 for BiasActGrad {
        fn name(&self) -> &'static str {
            "tb-bias-act-grad"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            b: &CudaStorage,
            bl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, n) = xl.shape().dims2()?;
            let func = kernel!(dev, PTX, "tb_bias_act_bwd", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (xv, bv, dyv) = (view::<T>(x, xl)?, view::<T>(b, bl)?, view::<T>(dy, dyl)?);
                let out = alloc::<T>(&dev, rows * n)?;
                let (rows_i, n_i, act) = (rows as i64, n as i32, self.0.code());
                // SAFETY: x, dy and out hold rows·n elements, b holds n.
                launch!(unsafe func, column_config(rows, n);
                    &xv, &bv, &dyv, &out, &rows_i, &n_i, &act)?;
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
    }

    pub fn bias_act(x: &Tensor, b: &Tensor, act: Act) -> Result<Option<Tensor>> {
        if !x.device().is_cuda() || !float_dtype(x) || x.rank() != 2 || b.dtype() != x.dtype() {
            return Ok(None);
        }
        let (x, b) = (x.contiguous()?, b.contiguous()?);
        Ok(Some(x.apply_op2(&b, BiasAct(act))?))
    }

    pub fn bias_act_bwd(
        x: &Tensor,
        b: &Tensor,
        dy: &Tensor,
        act: Act,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let same = b.dtype() == x.dtype() && dy.dtype() == x.dtype() && dy.dims() == x.dims();
        if !x.device().is_cuda() || !float_dtype(x) || x.rank() != 2 || !same {
            return Ok(None);
        }
        let (x, b) = (x.contiguous()?, b.contiguous()?);
        grads(&x, &b, dy, act).map(Some)
    }
}
