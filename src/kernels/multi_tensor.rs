//! The optimizer's update over every parameter in a handful of launches (`--fused adamw`;
//! kernels in multi_tensor.cu): the gradient norm, torch `clip_grad_norm_`'s factor and AdamW.
//! The factor stays on the device, so the step needs no host sync before its update; the
//! per-tensor path (adamw.rs) took three launches a parameter and a sync for the norm.
//!
//! Shapes: tensors i = 0..k, each contiguous with n_i elements: param (n_i,) of one float dtype;
//! grad (n_i,) of any float dtype (bf16 gradients of f32 masters need no cast first; one launch
//! group per dtype); mv (2, n_i) f32, the moments (updated in place); clip (2,) f32 = (norm,
//! factor).

use super::{enabled, AdamStep, Fused};
use candle_core::{DType, Result, Tensor};

/// The global L2 norm of `grads` over `loss_scale` (torch `clip_grad_norm_` after unscaling)
/// and the factor every gradient is multiplied by: min(1, max_norm / (norm + 1e-6)) /
/// loss_scale (1 / loss_scale when max_norm ≤ 0). A (2,) f32 tensor on the device.
pub fn grad_norm_clip(grads: &[Tensor], loss_scale: f64, max_norm: f64) -> Result<Option<Tensor>> {
    if !enabled(Fused::Adamw) {
        return Ok(None);
    }
    imp::grad_norm_clip(grads, loss_scale, max_norm)
}

/// One AdamW step of every `params[i]` (in place) with `grads[i] · h.grad_scale · clip[1]`;
/// `moments[i]` (2, n_i) f32, updated in place. Returns whether it applied (CUDA, parameters
/// of one float dtype, every tensor contiguous).
pub fn adamw_multi(
    params: &[Tensor],
    grads: &[Tensor],
    moments: &[Tensor],
    h: &AdamStep,
    clip: &Tensor,
) -> Result<bool> {
    if !enabled(Fused::Adamw) {
        return Ok(false);
    }
    imp::adamw_multi(params, grads, moments, h, clip)
}

/// [`adamw_multi`] over f32 parameters that also writes each updated parameter in `dtype`
/// (bf16 / f16), rounded as [`cast_multi`] rounds it: the next step's compute copies, as views
/// of one flat buffer, without a pass that reads the masters again. None where it does not
/// apply (nothing updated then): parameters not f32, or what [`adamw_multi`] refuses.
pub fn adamw_multi_copies(
    params: &[Tensor],
    grads: &[Tensor],
    moments: &[Tensor],
    h: &AdamStep,
    clip: &Tensor,
    dtype: DType,
) -> Result<Option<Vec<Tensor>>> {
    if !enabled(Fused::Adamw) || !enabled(Fused::AdamwCopies) {
        return Ok(None);
    }
    imp::adamw_multi_copies(params, grads, moments, h, clip, dtype)
}

/// Every f32 tensor of `srcs` cast to `dtype` (bf16 / f16) in a few launches, as views of one
/// flat buffer: the training step's compute copies of the masters. None where it does not
/// apply (CPU, switched off with `adamw`, a source that is not f32 contiguous on CUDA).
pub fn cast_multi(srcs: &[Tensor], dtype: DType) -> Result<Option<Vec<Tensor>>> {
    if !enabled(Fused::Adamw) {
        return Ok(None);
    }
    imp::cast_multi(srcs, dtype)
}

/// Every tensor of `srcs` (floats of any mix of dtypes, contiguous on CUDA) cast to `dtype` in
/// one fresh flat buffer, a launch per source dtype and 36 tensors, each copy from a multiple
/// of 8 elements (the gaps between them unwritten): (the buffer (len,), each copy's start).
/// Data parallelism's gradient buckets, in one pass. None where it does not apply (CPU,
/// switched off with `adamw`).
pub fn cast_multi_flat(srcs: &[Tensor], dtype: DType) -> Result<Option<(Tensor, Vec<usize>)>> {
    if !enabled(Fused::Adamw) {
        return Ok(None);
    }
    imp::cast_multi_flat(srcs, dtype)
}

/// The CPU computes the norm on the host (`train::Clip`).
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::AdamStep;
    use candle_core::{DType, Result, Tensor};

    pub fn cast_multi(_: &[Tensor], _: DType) -> Result<Option<Vec<Tensor>>> {
        Ok(None)
    }

    pub fn cast_multi_flat(_: &[Tensor], _: DType) -> Result<Option<(Tensor, Vec<usize>)>> {
        Ok(None)
    }

    pub fn grad_norm_clip(_: &[Tensor], _: f64, _: f64) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn adamw_multi(
        _: &[Tensor],
        _: &[Tensor],
        _: &[Tensor],
        _: &AdamStep,
        _: &Tensor,
    ) -> Result<bool> {
        Ok(false)
    }

    pub fn adamw_multi_copies(
        _: &[Tensor],
        _: &[Tensor],
        _: &[Tensor],
        _: &AdamStep,
        _: &Tensor,
        _: DType,
    ) -> Result<Option<Vec<Tensor>>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::AdamStep;
    use crate::kernels::launch::{
        alloc, device_address as address, kernel, launch, no_cpu_fwd, ptx, suffix, with_dtype,
        wrap, Ptx,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig};
    use candle_core::{
        CudaDevice, CudaStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor,
    };

    const PTX: Ptx = ptx!("multi_tensor");
    /// Tensors per launch and elements per block: MT_MAX and CHUNK of multi_tensor.cu.
    const MT_MAX: usize = 36;
    const CHUNK: usize = 16384;

    /// multi_tensor.cu's `MtTensors`, passed by value (1592 bytes of kernel parameters).
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct MtTensors {
        param: [u64; MT_MAX],
        grad: [u64; MT_MAX],
        mv: [u64; MT_MAX],
        /// Where AdamW writes the updated parameter in the compute dtype; 0: nowhere.
        copy: [u64; MT_MAX],
        n: [i64; MT_MAX],
        block0: [i32; MT_MAX + 1],
        count: i32,
    }

    // SAFETY: plain old data with the C layout the kernels declare.
    unsafe impl DeviceRepr for MtTensors {}

    /// One launch's tensors and its grid (one block a chunk).
    struct Group {
        table: MtTensors,
        blocks: usize,
    }

    /// The launches over tensors 0..k: `params`/`moments` may be empty (the norm reads grads
    /// only).
    fn groups(params: &[Tensor], grads: &[Tensor], moments: &[Tensor]) -> Result<Vec<Group>> {
        let mut out = Vec::new();
        for (c, chunk) in grads.chunks(MT_MAX).enumerate() {
            let mut table = MtTensors {
                param: [0; MT_MAX],
                grad: [0; MT_MAX],
                mv: [0; MT_MAX],
                copy: [0; MT_MAX],
                n: [0; MT_MAX],
                block0: [0; MT_MAX + 1],
                count: chunk.len() as i32,
            };
            let mut blocks = 0;
            for (j, g) in chunk.iter().enumerate() {
                let i = c * MT_MAX + j;
                table.grad[j] = address(g)?;
                if let (Some(p), Some(mv)) = (params.get(i), moments.get(i)) {
                    table.param[j] = address(p)?;
                    table.mv[j] = address(mv)?;
                }
                table.n[j] = g.elem_count() as i64;
                table.block0[j] = blocks as i32;
                blocks += g.elem_count().div_ceil(CHUNK).max(1);
            }
            table.block0[chunk.len()] = blocks as i32;
            out.push(Group { table, blocks });
        }
        Ok(out)
    }

    fn config(blocks: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn cuda(t: &Tensor) -> Option<CudaDevice> {
        match t.device() {
            Device::Cuda(d) => Some(d.clone()),
            _ => None,
        }
    }

    const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

    /// One float dtype over all of `ts`, CUDA and contiguous.
    fn uniform(ts: &[Tensor], dtype: DType) -> bool {
        ts.iter()
            .all(|t| t.dtype() == dtype && t.device().is_cuda() && t.is_contiguous())
    }

    /// Every tensor a float on CUDA, contiguous.
    fn usable(ts: &[Tensor]) -> bool {
        ts.iter()
            .all(|t| FLOATS.contains(&t.dtype()) && t.device().is_cuda() && t.is_contiguous())
    }

    /// The tensors of `ts` at the indices where `grads` is stored in `dtype`.
    fn of_dtype(ts: &[Tensor], grads: &[Tensor], dtype: DType) -> Vec<Tensor> {
        let picked = ts.iter().zip(grads).filter(|(_, g)| g.dtype() == dtype);
        picked.map(|(t, _)| t.clone()).collect()
    }

    /// One launch of a cast: its kernel, its tensors (their grad slots) and where each copy
    /// starts in the buffer (elements).
    struct CastLaunch {
        name: String,
        group: Group,
        starts: Vec<usize>,
    }

    /// The launches' copies written into one fresh buffer of `len` elements of `dtype`.
    struct CastAll {
        launches: Vec<CastLaunch>,
        len: usize,
        dtype: DType,
    }

    impl CustomOp1 for CastAll {
        fn name(&self) -> &'static str {
            "tb-mt-cast"
        }
        no_cpu_fwd!(CustomOp1);
        fn cuda_fwd(&self, src: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = src.device().clone();
            let size = self.dtype.size_in_bytes() as u64;
            with_dtype!(self.dtype, T => {
                let out = alloc::<T>(&dev, self.len)?;
                let stream = dev.cuda_stream();
                let base = out.device_ptr(&stream).0;
                for l in &self.launches {
                    let func = dev.get_or_load_custom_func(&l.name, PTX.module, PTX.text)?;
                    let mut table = l.group.table;
                    for (j, &start) in l.starts.iter().enumerate() {
                        table.param[j] = base + size * start as u64;
                    }
                    // SAFETY: each source holds n_j elements, out n_j from its start.
                    launch!(unsafe func, config(l.group.blocks); &table)?;
                }
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(self.len)))
            })
        }
    }

    /// Where each of `srcs` starts in one flat buffer, each on a 16-byte boundary (8 elements:
    /// the vector kernels and cuBLAS want it), and the buffer's length.
    fn flat_starts(srcs: &[Tensor]) -> (Vec<usize>, usize) {
        let starts: Vec<usize> = srcs
            .iter()
            .scan(0, |at, t| {
                let start = *at;
                *at = (start + t.elem_count()).next_multiple_of(8);
                Some(start)
            })
            .collect();
        let len = starts.last().unwrap_or(&0) + srcs.last().map_or(0, Tensor::elem_count);
        (starts, len)
    }

    /// Each of `srcs` as a view of `flat` from its start, in its own shape.
    fn views(flat: &Tensor, srcs: &[Tensor], starts: &[usize]) -> Result<Vec<Tensor>> {
        let views = srcs
            .iter()
            .zip(starts)
            .map(|(t, &start)| flat.narrow(0, start, t.elem_count())?.reshape(t.shape()));
        views.collect()
    }

    pub fn cast_multi_flat(srcs: &[Tensor], dtype: DType) -> Result<Option<(Tensor, Vec<usize>)>> {
        if srcs.first().and_then(cuda).is_none() || !usable(srcs) || !FLOATS.contains(&dtype) {
            return Ok(None);
        }
        let (starts, len) = flat_starts(srcs);
        let mut launches = Vec::new();
        for from in FLOATS {
            let picked: Vec<usize> = (0..srcs.len())
                .filter(|&i| srcs[i].dtype() == from)
                .collect();
            let tensors: Vec<Tensor> = picked.iter().map(|&i| srcs[i].clone()).collect();
            let name = format!("tb_mt_cast_{}_{}", suffix(from)?, suffix(dtype)?);
            for (group, at) in groups(&[], &tensors, &[])?
                .into_iter()
                .zip(picked.chunks(MT_MAX))
            {
                let starts = at.iter().map(|&i| starts[i]).collect();
                launches.push(CastLaunch {
                    name: name.clone(),
                    group,
                    starts,
                });
            }
        }
        let op = CastAll {
            launches,
            len,
            dtype,
        };
        let flat = srcs[0].apply_op1_no_bwd(&op)?; // (len,): every copy, gaps unwritten
        Ok(Some((flat, starts)))
    }

    pub fn cast_multi(srcs: &[Tensor], dtype: DType) -> Result<Option<Vec<Tensor>>> {
        if !matches!(dtype, DType::BF16 | DType::F16) || !uniform(srcs, DType::F32) {
            return Ok(None);
        }
        let Some((flat, starts)) = cast_multi_flat(srcs, dtype)? else {
            return Ok(None);
        };
        views(&flat, srcs, &starts).map(Some)
    }

    pub fn grad_norm_clip(
        grads: &[Tensor],
        loss_scale: f64,
        max_norm: f64,
    ) -> Result<Option<Tensor>> {
        let Some(dev) = grads.first().and_then(cuda) else {
            return Ok(None);
        };
        if !usable(grads) {
            return Ok(None);
        }
        // Launch groups per dtype, their partial sums side by side.
        let mut launches = Vec::new();
        for dtype in FLOATS {
            for g in groups(&[], &of_dtype(grads, grads, dtype), &[])? {
                launches.push((dtype, g));
            }
        }
        let total: usize = launches.iter().map(|(_, g)| g.blocks).sum();
        let partials = Tensor::zeros(total, DType::F32, grads[0].device())?;
        let clip = Tensor::zeros(2, DType::F32, grads[0].device())?;
        let (partials_at, clip_at) = (address(&partials)?, address(&clip)?);
        let mut offset = 0u64;
        for (dtype, g) in &launches {
            let func = kernel!(dev, PTX, "tb_mt_sum_squares", *dtype)?;
            let out = partials_at + offset * 4;
            // SAFETY: every pointer of the table addresses n_i elements; partials holds one
            // float a block of every launch, this launch's from `offset`.
            launch!(unsafe func, config(g.blocks); &g.table, &out)?;
            offset += g.blocks as u64;
        }
        let finish = kernel!(dev, PTX, "tb_mt_clip")?;
        let (n, scale, max) = (total as i32, loss_scale as f32, max_norm as f32);
        let one_block = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: partials holds `total` floats, clip two.
        launch!(unsafe finish, one_block; &partials_at, &n, &clip_at, &scale, &max)?;
        Ok(Some(clip))
    }

    /// The CUDA device of an AdamW update over these tensors, where the kernel applies:
    /// parameters of one float dtype, gradients any float, moments (2, n_i) f32, every tensor
    /// contiguous; clip (2,) f32.
    fn adamw_device(
        params: &[Tensor],
        grads: &[Tensor],
        moments: &[Tensor],
        clip: &Tensor,
    ) -> Option<CudaDevice> {
        let dev = params.first().and_then(cuda)?;
        let dtype = params[0].dtype();
        let shapes_agree = params.len() == grads.len()
            && params.len() == moments.len()
            && params.iter().zip(grads).zip(moments).all(|((p, g), mv)| {
                g.elem_count() == p.elem_count() && mv.elem_count() == 2 * p.elem_count()
            });
        let applies = FLOATS.contains(&dtype)
            && shapes_agree
            && uniform(params, dtype)
            && usable(grads)
            && uniform(moments, DType::F32)
            && uniform(std::slice::from_ref(clip), DType::F32)
            && clip.elem_count() == 2;
        applies.then_some(dev)
    }

    /// The updates' launches, a launch group per gradient dtype; with `copies` = (their dtype,
    /// the flat buffer's address, each copy's start), each parameter also written there.
    fn launch_adamw(
        dev: &CudaDevice,
        (params, grads, moments): (&[Tensor], &[Tensor], &[Tensor]),
        h: &AdamStep,
        clip: &Tensor,
        copies: Option<(DType, u64, &[usize])>,
    ) -> Result<()> {
        let clip_at = address(clip)?;
        let f = |x: f64| x as f32;
        let (gscale, beta1, beta2) = (f(h.grad_scale), f(h.beta1), f(h.beta2));
        let (decay, step_size) = (f(1. - h.lr * h.weight_decay), f(h.lr / h.bc1));
        let (bc2_sqrt, eps) = (f(h.bc2_sqrt), f(h.eps));
        let dtype = params[0].dtype();
        for gd in FLOATS {
            let picked: Vec<usize> = (0..grads.len())
                .filter(|&i| grads[i].dtype() == gd)
                .collect();
            let pick =
                |ts: &[Tensor]| -> Vec<Tensor> { picked.iter().map(|&i| ts[i].clone()).collect() };
            let (p, g, mv) = (pick(params), pick(grads), pick(moments));
            // tb_mt_adamw_<parameter dtype>_<gradient dtype>, or with copies
            // tb_mt_adamw_copy_f32_<gradient dtype>_<copy dtype>
            let name = match copies {
                None => format!("tb_mt_adamw_{}_{}", suffix(dtype)?, suffix(gd)?),
                Some((cd, _, _)) => format!("tb_mt_adamw_copy_f32_{}_{}", suffix(gd)?, suffix(cd)?),
            };
            let func = dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?;
            for (mut group, at) in groups(&p, &g, &mv)?.into_iter().zip(picked.chunks(MT_MAX)) {
                if let Some((cd, base, starts)) = copies {
                    for (j, &i) in at.iter().enumerate() {
                        group.table.copy[j] = base + (cd.size_in_bytes() * starts[i]) as u64;
                    }
                }
                // SAFETY: the table's param and grad address n_i elements, mv 2·n_i floats,
                // copy (where set) n_i elements of the copies' buffer; clip holds two floats.
                launch!(unsafe func, config(group.blocks); &group.table, &clip_at, &gscale,
                    &beta1, &beta2, &decay, &step_size, &bc2_sqrt, &eps)?;
            }
        }
        Ok(())
    }

    pub fn adamw_multi(
        params: &[Tensor],
        grads: &[Tensor],
        moments: &[Tensor],
        h: &AdamStep,
        clip: &Tensor,
    ) -> Result<bool> {
        let Some(dev) = adamw_device(params, grads, moments, clip) else {
            return Ok(false);
        };
        launch_adamw(&dev, (params, grads, moments), h, clip, None)?;
        Ok(true)
    }

    pub fn adamw_multi_copies(
        params: &[Tensor],
        grads: &[Tensor],
        moments: &[Tensor],
        h: &AdamStep,
        clip: &Tensor,
        dtype: DType,
    ) -> Result<Option<Vec<Tensor>>> {
        let Some(dev) = adamw_device(params, grads, moments, clip) else {
            return Ok(None);
        };
        if params[0].dtype() != DType::F32 || !matches!(dtype, DType::BF16 | DType::F16) {
            return Ok(None);
        }
        let (starts, len) = flat_starts(params);
        let flat = with_dtype!(dtype, T => {
            let out = alloc::<T>(&dev, len)?;
            let base = out.device_ptr(&dev.cuda_stream()).0;
            launch_adamw(&dev, (params, grads, moments), h, clip, Some((dtype, base, &starts)))?;
            wrap(out, &dev, len) // (len,): every copy, the gaps between them unwritten
        });
        views(&flat, params, &starts).map(Some)
    }

    #[cfg(test)]
    #[test]
    fn the_table_has_the_kernels_layout() {
        // 5 pointer/size arrays of 36, 37 block starts, the count: multi_tensor.cu's struct.
        assert_eq!(
            std::mem::size_of::<MtTensors>(),
            5 * 8 * MT_MAX + 4 * (MT_MAX + 1) + 4
        );
    }
}
