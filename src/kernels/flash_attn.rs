//! Fused causal attention for training (`--fused flash`; kernels in flash_attn.cu):
//! FlashAttention-2's tiling on tensor cores, one kernel forward and two or three backward
//! (dq inside the dk/dv kernel by f32 atomics with `flash-dq`, else its own kernel), reading
//! the projection's rows [q | k | v] in place and writing the output with the heads merged.
//! The (B, nh, T, T) scores and probabilities are never stored: the forward keeps a
//! log-sum-exp a row, from which the backward recomputes them.
//!
//! Applies to causal attention without padding, bf16 / f16, head size 64 (gpt2's): the
//! training step of [`crate::train`]. Dropout on the probabilities with a hashed mask
//! ([`Keep::Hash`], the same bits the fused softmax draws for the same key), redrawn in the
//! backward, where T is even and B·nh·T² ≤ 2³² (32-bit indices); a stored mask is the composed
//! path's. Elsewhere the callers run the matmuls and the fused softmax.
//!
//! Shapes: `B` batch, `T` time, `nh` heads, `hs` = 64, `C` = nh·hs.
//! qkv, dqkv (B, T, 3C); y, dy (B, T, C); lse (B, nh, T) f32, in base 2 of the scores scaled
//! by `scale`·log2 e (only the backward reads it).

use super::{enabled, Fused, Keep};
use candle_core::{Result, Tensor};

/// The head size the kernels are built for.
pub const FLASH_HEAD_SIZE: usize = 64;

/// (y (B, T, C), lse (B, nh, T) f32) of dropout(softmax(q kᵀ·scale + causal)) v, qkv
/// (B, T, 3C) with `nh` heads, `keep` the dropout mask and p (None: no dropout). None where it
/// does not apply (CPU, switched off, f32, another head size, a stored mask).
pub fn flash_attention(
    qkv: &Tensor,
    nh: usize,
    scale: f64,
    keep: Option<(&Keep, f32)>,
) -> Result<Option<(Tensor, Tensor)>> {
    if !enabled(Fused::Flash) || matches!(keep, Some((Keep::Mask(_), _))) {
        return Ok(None);
    }
    imp::flash_attention(qkv, nh, scale, keep)
}

/// dqkv (B, T, 3C) of [`flash_attention`] from its input qkv, its output y and lse, dy
/// (B, T, C) and the forward's `keep`. None where the forward would not apply.
pub fn flash_attention_bwd(
    qkv: &Tensor,
    y: &Tensor,
    lse: &Tensor,
    dy: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::Flash) || matches!(keep, Some((Keep::Mask(_), _))) {
        return Ok(None);
    }
    imp::flash_attention_bwd(qkv, y, lse, dy, scale, keep)
}

/// The CPU runs the matmuls and candle's softmax.
#[cfg(not(feature = "cuda"))]
mod imp {
    use crate::kernels::Keep;
    use candle_core::{Result, Tensor};

    pub fn flash_attention(
        _: &Tensor,
        _: usize,
        _: f64,
        _: Option<(&Keep, f32)>,
    ) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }
    pub fn flash_attention_bwd(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: Option<(&Keep, f32)>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::FLASH_HEAD_SIZE;
    use crate::kernels::dropout::imp::KeepArgs;
    use crate::kernels::launch::{
        aligned16, alloc, device_address, flat_config, kernel, launch, no_cpu_fwd, ptx, view,
        with_dtype, Ptx, NULL,
    };
    use crate::kernels::Keep;
    use crate::kernels::{enabled, Fused};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{
        bail, CudaStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor,
    };

    const PTX: Ptx = ptx!("flash_attn");
    const TILE: usize = 64;
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    /// flash_attn.cu's SharedDq: six 16-bit tiles (q and dO twice, k, dSᵀ) of 64 rows at
    /// stride 72, and two buffers of 64 rows' lse and dsum.
    const SHARED_DQ_BYTES: u32 = (6 * TILE * (FLASH_HEAD_SIZE + 8) * 2 + 4 * TILE * 4) as u32;

    /// B, T, nh of a launch.
    #[derive(Clone, Copy)]
    struct Dims {
        b: i32,
        t: i32,
        nh: i32,
    }

    impl Dims {
        /// One block of 4 warps per 64 rows of each (b, h).
        fn tiles(&self) -> LaunchConfig {
            LaunchConfig {
                grid_dim: (
                    (self.t as usize).div_ceil(TILE) as u32,
                    (self.b * self.nh) as u32,
                    1,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            }
        }
        fn rows(&self) -> usize {
            (self.b * self.t * self.nh) as usize
        }
        /// B·T·C: dq's f32 sums with `flash-dq`.
        fn dq_elems(&self) -> usize {
            self.rows() * FLASH_HEAD_SIZE
        }
    }

    /// The forward: y from qkv, lse written at `lse` (a (B, nh, T) f32 tensor's address).
    struct FlashFwd {
        d: Dims,
        scale2: f32,
        lse: u64,
        drop: KeepArgs,
    }

    impl CustomOp1 for FlashFwd {
        fn name(&self) -> &'static str {
            "tb-flash-fwd"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, qkv: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = qkv.device().clone();
            let (b, t, c3) = l.shape().dims3()?;
            let func = kernel!(dev, PTX, "tb_flash_fwd", qkv.dtype())?;
            with_dtype!(qkv.dtype(), T => {
                let x = view::<T>(qkv, l)?;
                let y = alloc::<T>(&dev, b * t * c3 / 3)?;
                let d = self.d;
                // SAFETY: qkv holds B·T·3C elements, y B·T·C, lse B·nh·T floats; every
                // block reads and writes rows < T of its (b, h) only.
                let k = &self.drop;
                launch!(unsafe func, d.tiles(); &x, &y, &self.lse, &d.t, &d.nh, &self.scale2,
                    &k.key, &k.thresh, &k.scale)?;
                Ok((CudaStorage::wrap_cuda_slice(y, dev), Shape::from((b, t, c3 / 3))))
            })
        }
    }

    /// The backward: dqkv from (qkv, y, dy) and the forward's lse (at `lse`); dq inside the
    /// dk/dv kernel where `dq_in_dkv` (`--fused flash-dq`).
    struct FlashBwd {
        d: Dims,
        scale: f32,
        lse: u64,
        drop: KeepArgs,
        dq_in_dkv: bool,
    }

    impl CustomOp3 for FlashBwd {
        fn name(&self) -> &'static str {
            "tb-flash-bwd"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            qkv: &CudaStorage,
            ql: &Layout,
            y: &CudaStorage,
            yl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = qkv.device().clone();
            let dt = qkv.dtype();
            let (d, lse, k) = (self.d, self.lse, &self.drop);
            let scale2 = (self.scale as f64 * LOG2_E) as f32;
            let dsum_func = kernel!(dev, PTX, "tb_flash_bwd_dsum", dt)?;
            with_dtype!(dt, T => {
                let (x, yv, dyv) = (view::<T>(qkv, ql)?, view::<T>(y, yl)?, view::<T>(dy, dyl)?);
                let dsum = alloc::<f32>(&dev, d.rows())?;
                let dqkv = alloc::<T>(&dev, ql.shape().elem_count())?;
                if !self.dq_in_dkv {
                    // SAFETY: y and dy hold B·T·C elements (16-byte aligned, 8 lanes a head's
                    // row), dsum B·nh·T.
                    launch!(unsafe dsum_func, flat_config(d.rows() * 8); &yv, &dyv, &dsum, &NULL,
                        &d.b, &d.t, &d.nh)?;
                    let dkv_func = kernel!(dev, PTX, "tb_flash_bwd_dkv", dt)?;
                    let dq_func = kernel!(dev, PTX, "tb_flash_bwd_dq", dt)?;
                    // SAFETY: qkv and dqkv hold B·T·3C elements, dy B·T·C, lse and dsum B·nh·T;
                    // the dkv blocks write the k and v columns of their rows, the dq blocks the
                    // q columns: together every element of dqkv once.
                    launch!(unsafe dkv_func, d.tiles(); &x, &dyv, &lse, &dsum, &dqkv, &d.t, &d.nh,
                        &self.scale, &scale2, &k.key, &k.thresh, &k.scale)?;
                    launch!(unsafe dq_func, d.tiles(); &x, &dyv, &lse, &dsum, &dqkv, &d.t, &d.nh,
                        &self.scale, &scale2, &k.key, &k.thresh, &k.scale)?;
                    return Ok((CudaStorage::wrap_cuda_slice(dqkv, dev), ql.shape().clone()));
                }
                let dq_acc = alloc::<f32>(&dev, d.dq_elems())?;
                // SAFETY: as above; dq_acc holds B·T·C floats, each head's row zeroed by its
                // 8 lanes.
                launch!(unsafe dsum_func, flat_config(d.rows() * 8); &yv, &dyv, &dsum, &dq_acc,
                    &d.b, &d.t, &d.nh)?;
                let dkvq_func = kernel!(dev, PTX, "tb_flash_bwd_dkvq", dt)?;
                let max_shared =
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
                dkvq_func.set_attribute(max_shared, SHARED_DQ_BYTES as i32).w()?;
                let cfg = LaunchConfig { shared_mem_bytes: SHARED_DQ_BYTES, ..d.tiles() };
                // SAFETY: as the dkv kernel's, and every block adds to the rows < T of its
                // (b, h) in dq_acc only (atomics).
                launch!(unsafe dkvq_func, cfg; &x, &dyv, &lse, &dsum, &dqkv, &dq_acc, &d.t, &d.nh,
                    &self.scale, &scale2, &k.key, &k.thresh, &k.scale)?;
                let cast_func = kernel!(dev, PTX, "tb_flash_bwd_dq_cast", dt)?;
                let (bt, c) = ((d.b * d.t) as i64, d.nh * FLASH_HEAD_SIZE as i32);
                // SAFETY: dq_acc holds B·T·C floats (C a multiple of 4), dqkv B·T·3C
                // elements; the cast writes the q columns, the dkvq blocks the k and v ones.
                launch!(unsafe cast_func, flat_config(d.dq_elems() / 4); &dq_acc, &dqkv, &bt, &c,
                    &self.scale)?;
                Ok((CudaStorage::wrap_cuda_slice(dqkv, dev), ql.shape().clone()))
            })
        }
    }

    /// The dims of qkv (B, T, 3C) with `nh` heads when the kernels take it (with `dropout`:
    /// T even, the probabilities' flat indices within 32 bits).
    fn dims_of(qkv: &Tensor, nh: usize, dropout: bool) -> Result<Option<Dims>> {
        let (b, t, c3) = qkv.dims3()?;
        let half = matches!(qkv.dtype(), DType::BF16 | DType::F16);
        let usable = qkv.device().is_cuda() && half && aligned16(qkv) && t > 0;
        let indexable = (b * nh * t) as u64 * t as u64 <= 1 << 32 && t.is_multiple_of(2);
        if !usable || c3 != 3 * nh * FLASH_HEAD_SIZE || (dropout && !indexable) {
            return Ok(None);
        }
        let (b, t, nh) = (b as i32, t as i32, nh as i32);
        Ok(Some(Dims { b, t, nh }))
    }

    pub fn flash_attention(
        qkv: &Tensor,
        nh: usize,
        scale: f64,
        keep: Option<(&Keep, f32)>,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Some(d) = dims_of(qkv, nh, keep.is_some())? else {
            return Ok(None);
        };
        let (b, t, _) = qkv.dims3()?;
        let lse = Tensor::zeros((b, nh, t), DType::F32, qkv.device())?;
        let op = FlashFwd {
            d,
            scale2: (scale * LOG2_E) as f32,
            lse: device_address(&lse)?,
            drop: KeepArgs::new(keep),
        };
        let y = qkv.apply_op1_no_bwd(&op)?;
        Ok(Some((y, lse)))
    }

    pub fn flash_attention_bwd(
        qkv: &Tensor,
        y: &Tensor,
        lse: &Tensor,
        dy: &Tensor,
        scale: f64,
        keep: Option<(&Keep, f32)>,
    ) -> Result<Option<Tensor>> {
        let (b, t, c3) = qkv.dims3()?;
        let nh = c3 / 3 / FLASH_HEAD_SIZE;
        let Some(d) = dims_of(qkv, nh, keep.is_some())? else {
            return Ok(None);
        };
        let (dy, y) = (dy.reshape((b, t, c3 / 3))?, y.reshape((b, t, c3 / 3))?);
        // The tiles of dy are copied in 16-byte vectors; dsum reads y and dy in them. (A
        // fresh buffer from 0: candle's `copy` keeps the layout, its offset too.)
        let dy = if aligned16(&dy) {
            dy
        } else {
            dy.force_contiguous()?
        };
        let y = if aligned16(&y) {
            y
        } else {
            y.force_contiguous()?
        };
        let same = |x: &Tensor| x.dtype() == qkv.dtype() && x.is_contiguous();
        if !same(&y) || !same(&dy) || lse.dims() != [b, nh, t] || lse.dtype() != DType::F32 {
            bail!(
                "flash attention backward: y, dy or lse does not match qkv {:?}",
                qkv.shape()
            );
        }
        let op = FlashBwd {
            d,
            scale: scale as f32,
            lse: device_address(lse)?,
            drop: KeepArgs::new(keep),
            dq_in_dkv: enabled(Fused::FlashDq),
        };
        Ok(Some(qkv.apply_op3_no_bwd(&y, &dy, &op)?))
    }
}
