//! Bias + activation in one pass, differentiable (`--fused bias-act`; kernels in bias_act.cu):
//! forward y = act(x + b), backward dx = dy ⊙ act'(x + b) and db = Σ_rows dx (f32, two
//! passes in a fixed order: [`bias_grad`]; the backward's first pass runs inside dx's kernel,
//! so dx is not read again).
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

/// The bias gradient Σ_rows dy of dy (N, C) as (C,) f32, summed in f32 in a fixed order (two
/// passes: row chunks, then the chunks of each column); the manual training step's db.
pub fn bias_grad(dy: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::BiasAct) {
        return Ok(None);
    }
    imp::bias_grad(dy)
}

/// The CPU runs candle's broadcast add and activation.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{Result, Tensor};

    pub fn bias_grad(_: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }

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
        alloc, column_config, flat_config, float_dtype, kernel, launch, no_cpu_fwd, ptx, view,
        with_dtype, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig};
    use candle_core::cuda_backend::{CudaDType, CudaDevice};
    use candle_core::{
        CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
    };
    use std::cell::RefCell;

    const PTX: Ptx = ptx!("bias_act");

    /// Whether the 16-byte vector kernels apply: rows of `n` whole vectors, every operand's
    /// start (`layouts`; fresh outputs are aligned) on a 16-byte boundary.
    fn vectors(n: usize, dtype: DType, layouts: &[&Layout]) -> bool {
        let size = dtype.size_in_bytes();
        let aligned = layouts
            .iter()
            .all(|l| (l.start_offset() * size).is_multiple_of(16));
        (n * size).is_multiple_of(16) && aligned
    }

    /// The elementwise launch: flat over the vectors, or the scalar kernels' column grid.
    fn elementwise_config(vec: bool, rows: usize, n: usize, dtype: DType) -> LaunchConfig {
        if vec {
            flat_config(rows * n * dtype.size_in_bytes() / 16)
        } else {
            column_config(rows, n)
        }
    }

    /// Row chunks of the bias gradient's first pass: with 32 columns a block, 768 columns
    /// give 24 · 32 = 768 blocks, enough to fill 132 SMs.
    const CHUNKS: usize = 32;
    /// The first pass's blocks to aim for: four an SM of an H100.
    const BLOCKS: usize = 4 * 132;

    /// db (n,) f32 = Σ_rows dy, dy (rows, n).
    struct BiasGrad;

    impl CustomOp1 for BiasGrad {
        fn name(&self) -> &'static str {
            "tb-bias-grad"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, dy: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = dy.device().clone();
            let (rows, n) = l.shape().dims2()?;
            let dt = dy.dtype();
            let vec = vectors(n, dt, &[l]);
            let (func, cols) = if vec {
                let cols = 32 * 16 / dt.size_in_bytes();
                (kernel!(dev, PTX, "tb_col_sum_part_vec", dt)?, cols)
            } else {
                (kernel!(dev, PTX, "tb_col_sum_part", dt)?, 32)
            };
            let (cfg, chunks) = sum_grid(rows, n, cols);
            let part = alloc::<f32>(&dev, chunks * n)?;
            let (rows_i, n_i) = (rows as i64, n as i32);
            with_dtype!(dy.dtype(), T => {
                let dyv = view::<T>(dy, l)?;
                // SAFETY: dy holds rows·n elements, part chunks·n (one row per grid row).
                launch!(unsafe func, cfg; &dyv, &part, &rows_i, &n_i)?;
            });
            let out = finish_sum(&dev, &part, chunks, n)?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(n)))
        }
    }

    /// The column sums' first pass: blocks of `cols` columns by row chunks, at least BLOCKS
    /// blocks (the vector kernels' blocks each cover 8× the columns). Returns the launch and the
    /// chunk count.
    fn sum_grid(rows: usize, n: usize, cols: usize) -> (LaunchConfig, usize) {
        let col_blocks = n.div_ceil(cols);
        let chunks = CHUNKS.max(BLOCKS / col_blocks).min(rows.max(1));
        let cfg = LaunchConfig {
            grid_dim: (col_blocks as u32, chunks as u32, 1),
            block_dim: (32, 16, 1),
            shared_mem_bytes: 0,
        };
        (cfg, chunks)
    }

    /// The column sums' second pass: (n,) f32, each column's chunks of `part` (chunks, n)
    /// summed in order.
    fn finish_sum(
        dev: &CudaDevice,
        part: &CudaSlice<f32>,
        chunks: usize,
        n: usize,
    ) -> Result<CudaSlice<f32>> {
        let out = alloc::<f32>(dev, n)?;
        let finish = kernel!(dev, PTX, "tb_col_sum_finish")?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (chunks_i, n_i) = (chunks as i32, n as i32);
        // SAFETY: part holds chunks·n elements, out n.
        launch!(unsafe finish, cfg; part, &out, &chunks_i, &n_i)?;
        Ok(out)
    }

    /// dx = dy ⊙ act'(x + b) and the first pass of db's column sums in one kernel (the vector
    /// layout only): dx is not read back. A custom op returns one tensor, so the partials wait
    /// here for [`TakeSum`].
    struct BiasActGradSum {
        act: Act,
        part: RefCell<Option<(CudaSlice<f32>, usize)>>,
    }

    impl CustomOp3 for BiasActGradSum {
        fn name(&self) -> &'static str {
            "tb-bias-act-grad-sum"
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
            let dt = x.dtype();
            let func = kernel!(dev, PTX, "tb_bias_act_bwd_sum_vec", dt)?;
            // The grid BiasGrad gives the vector kernel: the same partials, bit for bit.
            let (cfg, chunks) = sum_grid(rows, n, 32 * 16 / dt.size_in_bytes());
            let part = alloc::<f32>(&dev, chunks * n)?;
            with_dtype!(dt, T => {
                let (xv, bv, dyv) = (view::<T>(x, xl)?, view::<T>(b, bl)?, view::<T>(dy, dyl)?);
                let out = alloc::<T>(&dev, rows * n)?;
                let (rows_i, n_i, act) = (rows as i64, n as i32, self.act.code());
                // SAFETY: x, dy and out hold rows·n elements, b n, part chunks·n; whole aligned
                // vectors (`vectors`, checked by the caller).
                launch!(unsafe func, cfg;
                    &xv, &bv, &dyv, &out, &part, &rows_i, &n_i, &act)?;
                *self.part.borrow_mut() = Some((part, chunks));
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
    }

    /// db (n,) f32: the second pass over the partials a [`BiasActGradSum`] left. Applied to that
    /// op's dx, which only brings the device.
    struct TakeSum<'a>(&'a BiasActGradSum);

    impl CustomOp1 for TakeSum<'_> {
        fn name(&self) -> &'static str {
            "tb-bias-act-grad-sum-finish"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, dx: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = dx.device().clone();
            let n = l.shape().dims2()?.1;
            let Some((part, chunks)) = self.0.part.borrow_mut().take() else {
                candle_core::bail!("the bias gradient's partials were taken or never made")
            };
            let out = finish_sum(&dev, &part, chunks, n)?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(n)))
        }
    }

    pub fn bias_grad(dy: &Tensor) -> Result<Option<Tensor>> {
        if !dy.device().is_cuda() || !float_dtype(dy) || dy.rank() != 2 {
            return Ok(None);
        }
        Ok(Some(dy.contiguous()?.apply_op1_no_bwd(&BiasGrad)?))
    }

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
            let dt = x.dtype();
            let vec = vectors(n, dt, &[xl, bl]);
            let func = if vec {
                kernel!(dev, PTX, "tb_bias_act_fwd_vec", dt)?
            } else {
                kernel!(dev, PTX, "tb_bias_act_fwd", dt)?
            };
            let cfg = elementwise_config(vec, rows, n, dt);
            with_dtype!(x.dtype(), T => {
                let (xv, bv) = (view::<T>(x, xl)?, view::<T>(b, bl)?);
                let out = alloc::<T>(&dev, rows * n)?;
                let (rows_i, n_i, act) = (rows as i64, n as i32, self.0.code());
                // SAFETY: x and out hold rows·n elements, b holds n (the vector kernels: whole
                // aligned vectors, `vectors`).
                launch!(unsafe func, cfg; &xv, &bv, &out, &rows_i, &n_i, &act)?;
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
            Ok((Some(dx), Some(db.to_dtype(b.dtype())?)))
        }
    }

    /// dx = dy ⊙ act'(x + b) and db = Σ_rows dx: one kernel and the sums' second pass where
    /// the vector layout applies, else the elementwise kernel and [`BiasGrad`]'s two passes.
    fn grads(x: &Tensor, b: &Tensor, dy: &Tensor, act: Act) -> Result<(Tensor, Tensor)> {
        let dy = dy.contiguous()?;
        let n = dy.dim(1)?;
        let layouts = [x.layout(), b.layout(), dy.layout()];
        let whole = x.is_contiguous() && b.is_contiguous();
        if act != Act::None && whole && vectors(n, x.dtype(), &layouts) {
            let op = BiasActGradSum {
                act,
                part: RefCell::new(None),
            };
            let dx = x.apply_op3_no_bwd(b, &dy, &op)?;
            let db = dx.apply_op1_no_bwd(&TakeSum(&op))?;
            return Ok((dx, db));
        }
        let dx = match act {
            Act::None => dy.clone(),
            act => x.apply_op3_no_bwd(b, &dy, &BiasActGrad(act))?,
        };
        // f32; the autograd path's bias (storage dtype) takes it in that dtype.
        let db = dx.contiguous()?.apply_op1_no_bwd(&BiasGrad)?;
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
            let dt = x.dtype();
            let vec = vectors(n, dt, &[xl, bl, dyl]);
            let func = if vec {
                kernel!(dev, PTX, "tb_bias_act_bwd_vec", dt)?
            } else {
                kernel!(dev, PTX, "tb_bias_act_bwd", dt)?
            };
            let cfg = elementwise_config(vec, rows, n, dt);
            with_dtype!(x.dtype(), T => {
                let (xv, bv, dyv) = (view::<T>(x, xl)?, view::<T>(b, bl)?, view::<T>(dy, dyl)?);
                let out = alloc::<T>(&dev, rows * n)?;
                let (rows_i, n_i, act) = (rows as i64, n as i32, self.0.code());
                // SAFETY: x, dy and out hold rows·n elements, b holds n (the vector kernels:
                // whole aligned vectors, `vectors`).
                launch!(unsafe func, cfg;
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
