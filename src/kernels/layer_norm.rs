//! LayerNorm (kernels in layer_norm.cu), statistics in f32:
//! - training's (`--fused layer-norm`): one kernel forward; backward one kernel (dx and partial
//!   sums of dw and db over blocks of rows), or two (dx; the partial sums) where C is not
//!   whole 16-byte vectors, over 8 vectors a lane (bf16 C > 2048, f32 C > 1024) or the rows
//!   are unaligned (then the forward reads the row without vectors);
//! - generation's (`--fused decode`, [`add_layer_norm`]): the residual add and the next
//!   LayerNorm in one pass, a block a row (inference only, no backward).
//!
//! Shapes: x, r, y, dy, dx (…, C), seen as (rows, C); w, b, dw, db (C,); the partial sums
//! (⌈rows / LN_ROWS⌉, 2, C) f32 (⌈rows / LN_BWD_ROWS⌉ from the one-pass kernel).

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// LayerNorm over the last dim, differentiable: x (…, C), w and b (C,), statistics in f32.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Option<Tensor>> {
    if !enabled(Fused::LayerNorm) {
        return Ok(None);
    }
    imp::layer_norm(x, w, b, eps)
}

/// The backward of [`layer_norm`] as its own entry point (the manual training step calls it;
/// the op's autograd backward runs the same kernels): x, dy (…, C), w (C,) -> (dx like x,
/// dw (C,) f32, db (C,) f32). The statistics are recomputed from x.
pub fn layer_norm_bwd(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    if !enabled(Fused::LayerNorm) {
        return Ok(None);
    }
    imp::layer_norm_bwd(x, w, dy, eps)
}

/// What [`layer_norm_bwd_add`] computes.
pub struct ResidualGrads {
    /// res + the LayerNorm's dx (like x).
    pub dx: Tensor,
    /// (C,) f32.
    pub dw: Tensor,
    /// (C,) f32.
    pub db: Tensor,
    /// Σ over the rows of res, (C,) f32, where C ≤ 1536 (bf16 or f32): the bias gradient of
    /// the projection whose output gradient res is, without a column sum of its own.
    pub res_sum: Option<Tensor>,
}

/// [`layer_norm_bwd`] with the residual stream's gradient `res` (like x) added to dx in the
/// same kernel, rounded as the composed add of dx rounded to x's dtype, and res summed over
/// the rows. Only where the one-pass kernel applies (rows of whole 16-byte vectors, C ≤ 2048,
/// every operand from a 16-byte boundary once contiguous); else None.
pub fn layer_norm_bwd_add(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    res: &Tensor,
    eps: f64,
) -> Result<Option<ResidualGrads>> {
    if !enabled(Fused::LayerNorm) || !enabled(Fused::LnResidual) {
        return Ok(None);
    }
    imp::layer_norm_bwd_add(x, w, dy, res, eps)
}

/// (x + r, LayerNorm(x + r)) over the last dim, x and r (…, C), w and b (C,); the sum rounded
/// to x's dtype first, as the composed add. None where the kernel does not apply.
pub fn add_layer_norm(
    x: &Tensor,
    r: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<Option<(Tensor, Tensor)>> {
    if !enabled(Fused::Decode) {
        return Ok(None);
    }
    imp::add_layer_norm(x, r, w, b, eps)
}

/// The CPU runs candle's layer norm.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn layer_norm(_: &Tensor, _: &Tensor, _: &Tensor, _: f64) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn layer_norm_bwd(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: f64,
    ) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        Ok(None)
    }

    pub fn layer_norm_bwd_add(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: f64,
    ) -> Result<Option<super::ResidualGrads>> {
        Ok(None)
    }

    pub fn add_layer_norm(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: f64,
    ) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::ResidualGrads;
    use crate::kernels::launch::{
        aligned16, alloc, cuda, device_address, float_dtype, kernel, launch, no_cpu_fwd, ptx,
        storage, suffix, view, with_dtype, wrap, Ptx, NULL,
    };
    use crate::kernels::pdl::{trigger_first_suffix, Early};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{
        CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
    };
    use std::cell::RefCell;

    const PTX: Ptx = ptx!("layer_norm");

    /// Rows per block of the dw/db partial sums (LN_ROWS in layer_norm.cu): 16 gives gpt2's
    /// 8192 rows 512 blocks (64 gave 128, one an SM, and 42 µs a call on an H100).
    const LN_ROWS: usize = 16;

    /// One warp per row, 8 rows per block.
    fn warp_rows_config(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// y = (x − μ)·rstd·w + b over rows of C.
    struct LayerNorm {
        eps: f32,
    }

    impl CustomOp3 for LayerNorm {
        fn name(&self) -> &'static str {
            "tb-layer-norm"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
            b: &CudaStorage,
            bl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, c) = xl.shape().dims2()?;
            let func = match vector_lanes(c, x.dtype(), &[xl, wl, bl]) {
                Some(lanes) => {
                    let (tf, s) = (trigger_first_suffix(), suffix(x.dtype())?);
                    let name = format!("tb_layer_norm_fwd_vec{lanes}{tf}_{s}");
                    dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?
                }
                None => {
                    let (tf, s) = (trigger_first_suffix(), suffix(x.dtype())?);
                    let name = format!("tb_layer_norm_fwd{tf}_{s}");
                    dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?
                }
            };
            with_dtype!(x.dtype(), T => {
                let (xv, wv, bv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(b, bl)?);
                let early = Early::begin(&dev, rows)?;
                let out = alloc::<T>(&dev, rows * c)?;
                let (rows_i, c_i) = (rows as i64, c as i32);
                early.launch()?;
                // SAFETY: x and out hold rows·C elements, w and b C.
                launch!(unsafe func, warp_rows_config(rows);
                    &xv, &wv, &bv, &out, &rows_i, &c_i, &self.eps)?;
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
        fn bwd(
            &self,
            x: &Tensor,
            w: &Tensor,
            _b: &Tensor,
            _y: &Tensor,
            dy: &Tensor,
        ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
            let (dx, dw, db) = grads(x, w, &dy.contiguous()?, self.eps)?;
            let (dw, db) = (dw.to_dtype(w.dtype())?, db.to_dtype(w.dtype())?);
            Ok((Some(dx), Some(dw), Some(db)))
        }
    }

    /// dx (rows, C) and dw, db (C,) f32 of x, dy (rows, C) contiguous and w (C,).
    fn grads(x: &Tensor, w: &Tensor, dy: &Tensor, eps: f32) -> Result<(Tensor, Tensor, Tensor)> {
        let (dx, part) = match one_pass_lanes(x, w, dy)? {
            Some(lanes) => one_pass(x, w, dy, None, false, eps, lanes)?,
            None => (
                x.apply_op3_no_bwd(w, dy, &LayerNormGradX { eps })?,
                x.apply_op2_no_bwd(dy, &LayerNormGradWb { eps })?,
            ),
        };
        let sums = finish_sums(&part)?;
        Ok((dx, sums.get(0)?, sums.get(1)?))
    }

    /// The one-pass kernel: (dx, or res + dx where `res` is given, (rows, C); the partial sums
    /// (blocks, 2, C) f32 of dw and db, and of Σ res (blocks, 3, C) with `rsum`).
    fn one_pass(
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        res: Option<Tensor>,
        rsum: bool,
        eps: f32,
        lanes: usize,
    ) -> Result<(Tensor, Tensor)> {
        let op = LayerNormGradOnePass {
            eps,
            lanes,
            rsum: rsum && res.is_some(),
            res,
            part: RefCell::new(None),
        };
        let dx = x.apply_op3_no_bwd(w, dy, &op)?;
        let part = dx.apply_op1_no_bwd(&TakePart(&op))?;
        Ok((dx, part))
    }

    /// The partial sums (blocks, n, C) summed over the blocks: (n, C) f32 (dw, db[, Σ res]).
    fn finish_sums(part: &Tensor) -> Result<Tensor> {
        let (blocks, n, c) = part.dims3()?;
        // The blocks' partials summed in a fixed order by the bias gradient's column sum.
        match crate::kernels::bias_grad(&part.reshape((blocks, n * c))?)? {
            Some(sum) => sum.reshape((n, c)),
            None => part.sum(0),
        }
    }

    /// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)), g = dy ⊙ w.
    struct LayerNormGradX {
        eps: f32,
    }

    impl CustomOp3 for LayerNormGradX {
        fn name(&self) -> &'static str {
            "tb-layer-norm-grad-x"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, c) = xl.shape().dims2()?;
            let func = kernel!(dev, PTX, "tb_layer_norm_bwd_x", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (xv, wv, dyv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(dy, dyl)?);
                let out = alloc::<T>(&dev, rows * c)?;
                let (rows_i, c_i) = (rows as i64, c as i32);
                // SAFETY: x, dy and out hold rows·C elements, w C.
                launch!(unsafe func, warp_rows_config(rows);
                    &xv, &wv, &dyv, &out, &rows_i, &c_i, &self.eps)?;
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
    }

    /// Rows and warps a block of the one-pass backward, and its widest C (LN_BWD_ROWS,
    /// LN_BWD_WARPS and LN_BWD_MAXC in layer_norm.cu).
    const LN_BWD_ROWS: usize = 32;
    const LN_BWD_WARPS: usize = 8;
    const LN_BWD_MAXC: usize = 2048;
    /// The widest C whose Σ res fits the 48 KiB of shared memory a launch gets without
    /// asking: C floats a warp.
    const RSUM_MAXC: usize = 48 * 1024 / (4 * LN_BWD_WARPS);

    /// The vector kernels' 16-byte vectors a lane (1..=8), where they apply: rows of C whole
    /// vectors, C at most LN_BWD_MAXC, every operand's start (`layouts`, of contiguous
    /// operands: the callers make them so) on a 16-byte boundary.
    fn vector_lanes(c: usize, dtype: DType, layouts: &[&Layout]) -> Option<usize> {
        let size = dtype.size_in_bytes();
        let aligned = layouts
            .iter()
            .all(|l| (l.start_offset() * size).is_multiple_of(16));
        if !aligned || !(c * size).is_multiple_of(16) || c > LN_BWD_MAXC {
            return None;
        }
        let lanes = (c * size / 16).div_ceil(32);
        (lanes <= 8).then_some(lanes)
    }

    /// [`vector_lanes`] for the one-pass backward's operands.
    fn one_pass_lanes(x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<Option<usize>> {
        if ![x, w, dy].into_iter().all(aligned16) {
            return Ok(None);
        }
        let layouts = [x.layout(), w.layout(), dy.layout()];
        Ok(vector_lanes(w.dim(0)?, x.dtype(), &layouts))
    }

    /// dx and the dw / db partial sums in one kernel, a warp a row held in registers. A custom
    /// op returns one tensor, so the partials wait here for [`TakePart`]. `res` (rows, C),
    /// contiguous from a 16-byte boundary: added to dx; with `rsum`, also summed over the rows.
    struct LayerNormGradOnePass {
        eps: f32,
        lanes: usize,
        res: Option<Tensor>,
        rsum: bool,
        part: RefCell<Option<(CudaSlice<f32>, Shape)>>,
    }

    impl CustomOp3 for LayerNormGradOnePass {
        fn name(&self) -> &'static str {
            "tb-layer-norm-grad-one-pass"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            w: &CudaStorage,
            wl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, c) = xl.shape().dims2()?;
            let name = format!("tb_layer_norm_bwd_vec{}_{}", self.lanes, suffix(x.dtype())?);
            let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
            let blocks = rows.div_ceil(LN_BWD_ROWS);
            let parts = if self.rsum { 3 } else { 2 };
            let part = alloc::<f32>(&dev, blocks * parts * c)?;
            // C floats a warp for Σ res, else 2·C for the block's (dw, db).
            let sh_floats = if self.rsum { LN_BWD_WARPS * c } else { 2 * c };
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: (4 * sh_floats) as u32,
            };
            let res = match &self.res {
                Some(r) => device_address(r)?,
                None => NULL,
            };
            with_dtype!(x.dtype(), T => {
                let (xv, wv, dyv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(dy, dyl)?);
                let out = alloc::<T>(&dev, rows * c)?;
                let (rows_i, c_i) = (rows as i64, c as i32);
                let rsum = self.rsum as i32;
                // SAFETY: x, dy, res (where set) and out hold rows·C elements, w C, part
                // blocks·parts·C, shared memory sh_floats; whole aligned vectors, at most
                // `lanes` a lane (`one_pass_lanes`).
                launch!(unsafe func, cfg;
                    &xv, &wv, &dyv, &res, &rsum, &out, &part, &rows_i, &c_i, &self.eps)?;
                *self.part.borrow_mut() = Some((part, Shape::from((blocks, parts, c))));
                Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
    }

    /// The partials (blocks, 2 or 3, C) a [`LayerNormGradOnePass`] left; applied to its dx, which
    /// only brings the device.
    struct TakePart<'a>(&'a LayerNormGradOnePass);

    impl CustomOp1 for TakePart<'_> {
        fn name(&self) -> &'static str {
            "tb-layer-norm-grad-part"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, dx: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
            let Some((part, shape)) = self.0.part.borrow_mut().take() else {
                candle_core::bail!("the layer norm's partial sums were taken or never made")
            };
            Ok((
                CudaStorage::wrap_cuda_slice(part, dx.device().clone()),
                shape,
            ))
        }
    }

    /// Partial sums of dw = Σ dy ⊙ x̂ and db = Σ dy, LN_ROWS rows a block: (blocks, 2, C) f32.
    struct LayerNormGradWb {
        eps: f32,
    }

    impl CustomOp2 for LayerNormGradWb {
        fn name(&self) -> &'static str {
            "tb-layer-norm-grad-wb"
        }
        no_cpu_fwd!(CustomOp2);
        fn cuda_fwd(
            &self,
            x: &CudaStorage,
            xl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let (rows, c) = xl.shape().dims2()?;
            let blocks = rows.div_ceil(LN_ROWS);
            let func = kernel!(dev, PTX, "tb_layer_norm_bwd_wb", x.dtype())?;
            with_dtype!(x.dtype(), T => {
                let (xv, dyv) = (view::<T>(x, xl)?, view::<T>(dy, dyl)?);
                let part = alloc::<f32>(&dev, blocks * 2 * c)?;
                let (rows_i, c_i) = (rows as i64, c as i32);
                let cfg = LaunchConfig {
                    grid_dim: (blocks as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: x and dy hold rows·C elements, part blocks·2·C.
                launch!(unsafe func, cfg; &xv, &dyv, &part, &rows_i, &c_i, &self.eps)?;
                Ok((CudaStorage::wrap_cuda_slice(part, dev), Shape::from((blocks, 2, c))))
            })
        }
    }

    pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Option<Tensor>> {
        let c = x.dim(candle_core::D::Minus1)?;
        let same = w.dtype() == x.dtype() && b.dtype() == x.dtype();
        if !x.device().is_cuda() || !float_dtype(x) || !same || w.dims() != [c] || b.dims() != [c] {
            return Ok(None);
        }
        let x2 = x.contiguous()?.reshape(((), c))?; // (rows, C)
        let y = x2.apply_op3(
            &w.contiguous()?,
            &b.contiguous()?,
            LayerNorm { eps: eps as f32 },
        )?;
        Ok(Some(y.reshape(x.shape())?))
    }

    pub fn layer_norm_bwd(
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        eps: f64,
    ) -> Result<Option<(Tensor, Tensor, Tensor)>> {
        let c = x.dim(candle_core::D::Minus1)?;
        let same = w.dtype() == x.dtype() && dy.dtype() == x.dtype() && dy.dims() == x.dims();
        if !x.device().is_cuda() || !float_dtype(x) || !same || w.dims() != [c] {
            return Ok(None);
        }
        let x2 = x.contiguous()?.reshape(((), c))?; // (rows, C)
        let dy2 = dy.contiguous()?.reshape(((), c))?;
        let (dx, dw, db) = grads(&x2, &w.contiguous()?, &dy2, eps as f32)?;
        Ok(Some((dx.reshape(x.shape())?, dw, db)))
    }

    pub fn layer_norm_bwd_add(
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        res: &Tensor,
        eps: f64,
    ) -> Result<Option<ResidualGrads>> {
        let c = x.dim(candle_core::D::Minus1)?;
        let like_x = |t: &Tensor| t.dtype() == x.dtype() && t.dims() == x.dims();
        let same = w.dtype() == x.dtype() && like_x(dy) && like_x(res);
        if !x.device().is_cuda() || !float_dtype(x) || !same || w.dims() != [c] {
            return Ok(None);
        }
        let rows = |t: &Tensor| t.contiguous()?.reshape(((), c)); // (rows, C)
        let (x2, dy2, res2, w) = (rows(x)?, rows(dy)?, rows(res)?, w.contiguous()?);
        let Some(lanes) = one_pass_lanes(&x2, &w, &dy2)?.filter(|_| aligned16(&res2)) else {
            return Ok(None);
        };
        let rsum = c <= RSUM_MAXC;
        let (sum, part) = one_pass(&x2, &w, &dy2, Some(res2), rsum, eps as f32, lanes)?;
        let sums = finish_sums(&part)?; // (2 or 3, C)
        Ok(Some(ResidualGrads {
            dx: sum.reshape(x.shape())?,
            dw: sums.get(0)?,
            db: sums.get(1)?,
            res_sum: if rsum { Some(sums.get(2)?) } else { None },
        }))
    }

    pub fn add_layer_norm(
        x: &Tensor,
        r: &Tensor,
        w: &Tensor,
        b: &Tensor,
        eps: f64,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let c = x.dim(candle_core::D::Minus1)?;
        let same = [r, w, b].iter().all(|t| t.dtype() == x.dtype());
        if !x.device().is_cuda() || !float_dtype(x) || !same || r.shape() != x.shape() {
            return Ok(None);
        }
        if w.dims() != [c] || b.dims() != [c] {
            return Ok(None);
        }
        let rows = x.elem_count() / c;
        let (x2, r2) = (x.contiguous()?, r.contiguous()?);
        let (w, b) = (w.contiguous()?, b.contiguous()?);
        let (Some(xs), Some(rs), Some(ws), Some(bs)) = (cuda(&x2), cuda(&r2), cuda(&w), cuda(&b))
        else {
            return Ok(None);
        };
        let dev = storage(&xs.0).device().clone();
        let (tf, s) = (trigger_first_suffix(), suffix(x.dtype())?);
        let func = dev.get_or_load_custom_func(
            &format!("tb_add_layer_norm{tf}_{s}"),
            PTX.module,
            PTX.text,
        )?;
        // A 16-byte vector a thread where the rows allow it (add_layer_norm_vec).
        let n = 16 / x.dtype().size_in_bytes();
        let vec = c % n == 0 && c / n <= 1024 && [&x2, &r2, &w, &b].into_iter().all(aligned16);
        let threads = match vec {
            true => (c / n).next_multiple_of(32),
            false => c.next_power_of_two().clamp(32, 256),
        };
        let (sum, normed) = with_dtype!(x.dtype(), T => {
            let xv = view::<T>(storage(&xs.0), xs.1)?;
            let rv = view::<T>(storage(&rs.0), rs.1)?;
            let wv = view::<T>(storage(&ws.0), ws.1)?;
            let bv = view::<T>(storage(&bs.0), bs.1)?;
            let early = Early::begin(&dev, rows)?;
            let (s, y) = (alloc::<T>(&dev, rows * c)?, alloc::<T>(&dev, rows * c)?);
            let (c_i, eps, vec_i) = (c as i32, eps as f32, vec as i32);
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            early.launch()?;
            // SAFETY: x, r, s and y hold rows·C elements, w and b C; with `vec`, C / 8 (bf16)
            // or C / 4 (f32) vectors a row, at most one a thread, from 16-byte boundaries.
            launch!(unsafe func, cfg; &xv, &rv, &wv, &bv, &s, &y, &c_i, &eps, &vec_i)?;
            (wrap(s, &dev, x.shape()), wrap(y, &dev, x.shape()))
        });
        Ok(Some((sum, normed)))
    }
}
