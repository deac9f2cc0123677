//! The attention's head layout changes in one vectorised pass each (`--fused heads`; kernels in
//! heads.cu): a projection's rows split into per-head batches for the attention matmuls, and
//! per-head results merged back into rows. candle's strided copy did both at about a sixth of
//! the bandwidth (docs/perf-notes.md).
//!
//! Shapes: `B` batch, `T` time, `G` parts (q, k, v: 3), `nh` heads, `hs` head size.
//! x (B, T, G·nh·hs); parts (B, nh, T, hs) each; the split (G, B, nh, T, hs).

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// (G, B, nh, T, hs) contiguous from x (B, T, G·nh·hs): `x.reshape((B, T, G, nh, hs))
/// .permute((2, 0, 3, 1, 4)).contiguous()`. None where it does not apply (CPU, switched off, a
/// head row that is not a multiple of 16 bytes).
pub fn split_heads(x: &Tensor, g: usize, nh: usize) -> Result<Option<Tensor>> {
    if !enabled(Fused::Heads) {
        return Ok(None);
    }
    imp::split_heads(x, g, nh)
}

/// (B·T, G·nh·hs) from G ≤ 3 parts (B, nh, T, hs): `Tensor::stack(parts, 0).permute((1, 3, 0,
/// 2, 4)).reshape((B·T, G·nh·hs))`. None where it does not apply.
pub fn merge_heads(parts: &[&Tensor]) -> Result<Option<Tensor>> {
    if !enabled(Fused::Heads) {
        return Ok(None);
    }
    imp::merge_heads(parts)
}

/// The CPU runs candle's copies.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn split_heads(_: &Tensor, _: usize, _: usize) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn merge_heads(_: &[&Tensor]) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::launch::{
        aligned16, alloc, flat_config, kernel, launch, no_cpu_fwd, ptx, view, Ptx,
    };
    use crate::kernels::launch::{float_dtype, with_dtype};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};

    const PTX: Ptx = ptx!("heads");

    /// The dims both kernels take: B, T, G, nh, and V = 16-byte vectors per head row.
    #[derive(Clone, Copy)]
    struct Dims {
        b: i32,
        t: i32,
        g: i32,
        nh: i32,
        v: i32,
    }

    impl Dims {
        fn vectors(&self) -> usize {
            (self.b * self.t * self.g * self.nh * self.v) as usize
        }
    }

    struct SplitHeads(Dims);

    impl CustomOp1 for SplitHeads {
        fn name(&self) -> &'static str {
            "tb-split-heads"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = x.device().clone();
            let d = self.0;
            let n = xl.shape().elem_count();
            let func = kernel!(dev, PTX, "tb_split_heads")?;
            with_dtype!(x.dtype(), T => {
                let xv = view::<T>(x, xl)?;
                let out = alloc::<T>(&dev, n)?;
                // SAFETY: x and out hold B·T·G·nh·V vectors of 16 bytes (n elements).
                launch!(unsafe func, flat_config(d.vectors()); &xv, &out, &d.b, &d.t, &d.g,
                    &d.nh, &d.v)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), xl.shape().clone()))
            })
        }
    }

    struct MergeHeads(Dims);

    impl MergeHeads {
        fn run(&self, parts: [(&CudaStorage, &Layout); 3]) -> Result<(CudaStorage, Shape)> {
            let (p0, l0) = parts[0];
            let dev = p0.device().clone();
            let d = self.0;
            let n = l0.shape().elem_count() * d.g as usize;
            let func = kernel!(dev, PTX, "tb_merge_heads")?;
            with_dtype!(p0.dtype(), T => {
                let v0 = view::<T>(p0, l0)?;
                let v1 = view::<T>(parts[1].0, parts[1].1)?;
                let v2 = view::<T>(parts[2].0, parts[2].1)?;
                let out = alloc::<T>(&dev, n)?;
                // SAFETY: each part holds B·nh·T·V vectors, out G times that.
                launch!(unsafe func, flat_config(d.vectors()); &v0, &v1, &v2, &out, &d.b, &d.t,
                    &d.g, &d.nh, &d.v)?;
                let shape = Shape::from(((d.b * d.t) as usize, n / (d.b * d.t) as usize));
                Ok((CudaStorage::wrap_cuda_slice(out, dev), shape))
            })
        }
    }

    impl CustomOp1 for MergeHeads {
        fn name(&self) -> &'static str {
            "tb-merge-heads"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, p: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            self.run([(p, l); 3])
        }
    }

    impl CustomOp3 for MergeHeads {
        fn name(&self) -> &'static str {
            "tb-merge-heads"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            p0: &CudaStorage,
            l0: &Layout,
            p1: &CudaStorage,
            l1: &Layout,
            p2: &CudaStorage,
            l2: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            self.run([(p0, l0), (p1, l1), (p2, l2)])
        }
    }

    /// V for head size `hs` of `t`'s dtype, when a head row is whole 16-byte vectors.
    fn vectors_per_head(t: &Tensor, hs: usize) -> Option<i32> {
        let bytes = hs * t.dtype().size_in_bytes();
        bytes.is_multiple_of(16).then_some((bytes / 16) as i32)
    }

    pub fn split_heads(x: &Tensor, g: usize, nh: usize) -> Result<Option<Tensor>> {
        let (b, t, c) = x.dims3()?;
        if !x.device().is_cuda() || !float_dtype(x) || !aligned16(x) || c % (g * nh) != 0 {
            return Ok(None);
        }
        let hs = c / (g * nh);
        let Some(v) = vectors_per_head(x, hs) else {
            return Ok(None);
        };
        let (b32, t32, g32, nh32) = (b as i32, t as i32, g as i32, nh as i32);
        let d = Dims {
            b: b32,
            t: t32,
            g: g32,
            nh: nh32,
            v,
        };
        let out = x.apply_op1_no_bwd(&SplitHeads(d))?;
        Ok(Some(out.reshape((g, b, nh, t, hs))?))
    }

    pub fn merge_heads(parts: &[&Tensor]) -> Result<Option<Tensor>> {
        let Some(&first) = parts.first() else {
            return Ok(None);
        };
        let (b, nh, t, hs) = first.dims4()?;
        let same = parts
            .iter()
            .all(|p| p.dims() == first.dims() && p.dtype() == first.dtype() && aligned16(p));
        let usable = first.device().is_cuda() && float_dtype(first) && same;
        let (Some(v), true) = (vectors_per_head(first, hs), usable) else {
            return Ok(None);
        };
        let d = |g: usize| Dims {
            b: b as i32,
            t: t as i32,
            g: g as i32,
            nh: nh as i32,
            v,
        };
        Ok(match parts {
            [p] => Some(p.apply_op1_no_bwd(&MergeHeads(d(1)))?),
            [p0, p1, p2] => Some(p0.apply_op3_no_bwd(p1, p2, &MergeHeads(d(3)))?),
            _ => None,
        })
    }
}
