//! The token embedding's gradient as one scatter-add kernel (`--fused embedding`; kernels in
//! embedding.cu) instead of candle's `index_add`, which walked the rows one at a time; and the
//! training forward's token + position sum in one pass instead of a gather and a broadcast add.
//!
//! Shapes: N tokens (B·T), C channels, V vocabulary. ids (N,) u32; demb (N, C) f32; the
//! gradient it adds to (V, C) f32; wte (V, C), wpe (≥ T, C), the sum (N, C).

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// `dst` plus each row of `demb` added at row `ids[i]`: candle's `dst.index_add(ids, demb, 0)`
/// for f32 on CUDA (the sum of a repeated id's rows in no fixed order). None elsewhere.
pub fn embedding_bwd(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Embedding) {
        return Ok(None);
    }
    imp::embedding_bwd(dst, ids, demb)
}

/// [`embedding_bwd`] added into `dst` itself (contiguous f32 on CUDA): no copy of the (V, C)
/// gradient. Returns whether it applied; the caller must own `dst`'s storage alone (no other
/// tensor sees it change), and `demb` must not share it.
pub fn embedding_bwd_in_place(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> Result<bool> {
    if !enabled(Fused::Embedding) {
        return Ok(false);
    }
    imp::embedding_bwd_in_place(dst, ids, demb)
}

/// wte[ids] + wpe[position] for ids (B, T): (B·T, C), the sum in f32 rounded once (candle's
/// gather then broadcast add). None where it does not apply (CPU, switched off, dtypes that
/// differ, rows not whole 16-byte vectors).
pub fn embedding_fwd(wte: &Tensor, wpe: &Tensor, ids: &Tensor) -> Result<Option<Tensor>> {
    if !enabled(Fused::Embedding) {
        return Ok(None);
    }
    imp::embedding_fwd(wte, wpe, ids)
}

/// A position table and each row's position ((B·T) f32), for [`embed_rows`].
pub type Positions<'a> = (&'a Tensor, &'a Tensor);
/// A LayerNorm's weight, bias and epsilon, for [`embed_rows`].
pub type RowNorm<'a> = (&'a Tensor, &'a Tensor, f64);

/// A decode step's input rows (`--fused step-io`): wte[ids] for ids (B, T) u32, plus the
/// position table's rows at `positions` where given (GPT-2), then the LayerNorm `norm` where
/// given (BLOOM's word_embeddings_layernorm): (B·T, C) in one kernel that a programmatic edge
/// starts early, instead of candle's gathers and add or norm. None where it does not apply
/// (CPU, switched off, rows wider than the kernel holds, operands it does not take).
pub fn embed_rows(
    wte: &Tensor,
    ids: &Tensor,
    positions: Option<Positions<'_>>,
    norm: Option<RowNorm<'_>>,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::StepIo) {
        return Ok(None);
    }
    imp::embed_rows(wte, ids, positions, norm)
}

/// Launches of [`embed_rows`]'s kernel in this process (a GPU test checks that steps take it).
#[cfg(test)]
pub static EMBED_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The CPU runs candle's index_add, gather and add.
#[cfg(not(feature = "cuda"))]
mod imp {
    use candle_core::{Result, Tensor};

    pub fn embedding_bwd(_: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn embedding_bwd_in_place(_: &Tensor, _: &Tensor, _: &Tensor) -> Result<bool> {
        Ok(false)
    }
    pub fn embedding_fwd(_: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn embed_rows(
        _: &Tensor,
        _: &Tensor,
        _: Option<super::Positions<'_>>,
        _: Option<super::RowNorm<'_>>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use crate::kernels::launch::{
        aligned16, alloc, device_address, flat_config, float_dtype, kernel, launch, no_cpu_fwd,
        ptx, view, with_dtype, wrap, Ptx, NULL,
    };
    use crate::kernels::pdl::Early;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{
        bail, CudaStorage, CustomOp3, DType, InplaceOp3, Layout, Result, Shape, Tensor,
    };

    const PTX: Ptx = ptx!("embedding");

    /// out = dst, then out[ids[i]] += demb[i].
    struct EmbeddingBwd;

    /// (rows, c, vocab) of a scatter of demb (rows, c) by ids (rows,) into a (vocab, c) gradient.
    fn scatter_dims(dl: &Layout, il: &Layout, el: &Layout) -> Result<(usize, usize, usize)> {
        let (vocab, c) = dl.shape().dims2()?;
        let (rows, ec) = el.shape().dims2()?;
        if ec != c || il.shape().elem_count() != rows {
            bail!(
                "embedding backward: ids {:?}, rows {:?}, gradient {:?}",
                il.shape(),
                el.shape(),
                dl.shape()
            );
        }
        Ok((rows, c, vocab))
    }

    /// The scatter's launch shape (a block a row) and (rows, c, vocab) arguments.
    fn scatter_launch((rows, c, vocab): (usize, usize, usize)) -> (LaunchConfig, (i64, i32, i64)) {
        let cfg = LaunchConfig {
            grid_dim: (rows.clamp(1, 65535) as u32, 1, 1),
            block_dim: (c.next_power_of_two().clamp(32, 256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        (cfg, (rows as i64, c as i32, vocab as i64))
    }

    impl CustomOp3 for EmbeddingBwd {
        fn name(&self) -> &'static str {
            "tb-embedding-bwd"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            dst: &CudaStorage,
            dl: &Layout,
            ids: &CudaStorage,
            il: &Layout,
            demb: &CudaStorage,
            el: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = dst.device().clone();
            let dims = scatter_dims(dl, il, el)?;
            let (dv, iv, ev) = (
                view::<f32>(dst, dl)?,
                view::<u32>(ids, il)?,
                view::<f32>(demb, el)?,
            );
            let n = dims.1 * dims.2; // vocab · c
            let mut out = alloc::<f32>(&dev, n)?;
            dev.memcpy_dtod(&dv.slice(..n), &mut out)?;
            let func = kernel!(dev, PTX, "tb_embedding_bwd")?;
            let (cfg, (rows, c, vocab)) = scatter_launch(dims);
            // SAFETY: ids holds rows ids, demb rows·c elements, out vocab·c; ids ≥ vocab are
            // skipped by the kernel.
            launch!(unsafe func, cfg; &iv, &ev, &out, &rows, &c, &vocab)?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), dl.shape().clone()))
        }
    }

    /// dst[ids[i]] += demb[i], dst contiguous f32.
    struct EmbeddingBwdInPlace;

    impl InplaceOp3 for EmbeddingBwdInPlace {
        fn name(&self) -> &'static str {
            "tb-embedding-bwd-in-place"
        }
        no_cpu_fwd!(InplaceOp3);
        fn cuda_fwd(
            &self,
            dst: &mut CudaStorage,
            dl: &Layout,
            ids: &CudaStorage,
            il: &Layout,
            demb: &CudaStorage,
            el: &Layout,
        ) -> Result<()> {
            let dev = dst.device().clone();
            let dims = scatter_dims(dl, il, el)?;
            let (iv, ev) = (view::<u32>(ids, il)?, view::<f32>(demb, el)?);
            let off = dl.start_offset();
            let mut out = f32::as_cuda_slice_mut(dst)?.slice_mut(off..off + dims.1 * dims.2);
            let func = kernel!(dev, PTX, "tb_embedding_bwd")?;
            let (cfg, (rows, c, vocab)) = scatter_launch(dims);
            // SAFETY: as the copying op's, out the vocab·c elements of dst from its offset.
            launch!(unsafe func, cfg; &iv, &ev, &mut out, &rows, &c, &vocab)?;
            Ok(())
        }
    }

    /// Whether the scatter takes these: CUDA, f32 dst (vocab, c) and demb, u32 ids.
    fn applies(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> bool {
        let f32s = dst.dtype() == DType::F32 && demb.dtype() == DType::F32;
        dst.device().is_cuda() && f32s && ids.dtype() == DType::U32 && dst.rank() == 2
    }

    pub fn embedding_bwd_in_place(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> Result<bool> {
        if !applies(dst, ids, demb) || !dst.is_contiguous() {
            return Ok(false);
        }
        let (ids, demb) = (ids.contiguous()?, demb.contiguous()?);
        dst.inplace_op3(&ids, &demb, &EmbeddingBwdInPlace)?;
        Ok(true)
    }

    pub fn embedding_bwd(dst: &Tensor, ids: &Tensor, demb: &Tensor) -> Result<Option<Tensor>> {
        if !applies(dst, ids, demb) {
            return Ok(None);
        }
        let (dst, ids, demb) = (dst.contiguous()?, ids.contiguous()?, demb.contiguous()?);
        Ok(Some(dst.apply_op3_no_bwd(&ids, &demb, &EmbeddingBwd)?))
    }

    /// wte[ids] + wpe[position], ids (B, T) (the op's shape gives T).
    struct EmbeddingFwd;

    impl CustomOp3 for EmbeddingFwd {
        fn name(&self) -> &'static str {
            "tb-embedding-fwd"
        }
        no_cpu_fwd!(CustomOp3);
        fn cuda_fwd(
            &self,
            ids: &CudaStorage,
            il: &Layout,
            wte: &CudaStorage,
            tl: &Layout,
            wpe: &CudaStorage,
            pl: &Layout,
        ) -> Result<(CudaStorage, Shape)> {
            let dev = wte.device().clone();
            let (b, t) = il.shape().dims2()?;
            let (vocab, c) = tl.shape().dims2()?;
            let cv = c * wte.dtype().size_in_bytes() / 16;
            let func = kernel!(dev, PTX, "tb_embedding_fwd", wte.dtype())?;
            with_dtype!(wte.dtype(), T => {
                let (iv, tv, pv) = (view::<u32>(ids, il)?, view::<T>(wte, tl)?, view::<T>(wpe, pl)?);
                let out = alloc::<T>(&dev, b * t * c)?;
                let (rows, t_i, cv_i, vocab_i) = ((b * t) as i64, t as i32, cv as i32, vocab as i64);
                // SAFETY: ids holds B·T ids, wte V·C and wpe ≥ T·C elements, out B·T·C; rows
                // are whole 16-byte vectors from aligned starts (checked by embedding_fwd);
                // ids ≥ V give zero rows.
                launch!(unsafe func, flat_config(b * t * cv); &iv, &tv, &pv, &out, &rows, &t_i,
                    &cv_i, &vocab_i)?;
                Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from((b * t, c))))
            })
        }
    }

    pub fn embedding_fwd(wte: &Tensor, wpe: &Tensor, ids: &Tensor) -> Result<Option<Tensor>> {
        let (Ok((_, c)), Ok((p, pc)), Ok((_, t))) = (wte.dims2(), wpe.dims2(), ids.dims2()) else {
            return Ok(None);
        };
        let same = wte.dtype() == wpe.dtype() && float_dtype(wte) && c == pc && t <= p;
        let whole = (c * wte.dtype().size_in_bytes()).is_multiple_of(16);
        if !wte.device().is_cuda() || !same || !whole || ids.dtype() != DType::U32 {
            return Ok(None);
        }
        if !aligned16(wte) || !aligned16(wpe) || !ids.is_contiguous() {
            return Ok(None);
        }
        Ok(Some(ids.apply_op3_no_bwd(wte, wpe, &EmbeddingFwd)?))
    }

    /// Vectors a row [`embed_rows`]'s kernel holds: EMB_V a thread of EMB_THREADS.
    const EMB_MAX_VECTORS: usize = 4 * 128;

    /// Whether `t` is a contiguous `dims` tensor of `dtype` from a 16-byte boundary.
    fn operand(t: &Tensor, dtype: DType, dims: &[usize]) -> bool {
        t.dtype() == dtype && t.dims() == dims && aligned16(t)
    }

    pub fn embed_rows(
        wte: &Tensor,
        ids: &Tensor,
        positions: Option<super::Positions<'_>>,
        norm: Option<super::RowNorm<'_>>,
    ) -> Result<Option<Tensor>> {
        let (Ok((vocab, c)), dtype) = (wte.dims2(), wte.dtype()) else {
            return Ok(None);
        };
        let rows = ids.elem_count();
        let cv = c * dtype.size_in_bytes() / 16;
        let fits = float_dtype(wte) && (c * dtype.size_in_bytes()).is_multiple_of(16);
        let table = positions.is_none_or(|(wpe, p)| {
            let wide = wpe.dims2().is_ok_and(|(_, pc)| pc == c);
            let positions = p.dtype() == DType::F32 && p.elem_count() == rows && p.is_contiguous();
            wide && wpe.dtype() == dtype && aligned16(wpe) && positions
        });
        let normed =
            norm.is_none_or(|(w, b, _)| operand(w, dtype, &[c]) && operand(b, dtype, &[c]));
        let ids_ok = ids.dtype() == DType::U32 && ids.is_contiguous() && rows > 0;
        if !wte.device().is_cuda() || !fits || cv > EMB_MAX_VECTORS || !aligned16(wte) {
            return Ok(None);
        }
        if !table || !normed || !ids_ok {
            return Ok(None);
        }
        let dev = wte.device().as_cuda_device()?.clone();
        let address = |t: Option<&Tensor>| t.map_or(Ok(NULL), device_address);
        let (ids_a, wte_a) = (device_address(ids)?, device_address(wte)?);
        let (wpe_a, pos_a) = (
            address(positions.map(|p| p.0))?,
            address(positions.map(|p| p.1))?,
        );
        let (w_a, b_a) = (address(norm.map(|n| n.0))?, address(norm.map(|n| n.1))?);
        let eps = norm.map_or(0f32, |n| n.2 as f32);
        let func = kernel!(dev, PTX, "tb_embed_rows", dtype)?;
        let (cv_i, vocab_i) = (cv as i32, vocab as i64);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        Ok(Some(with_dtype!(dtype, T => {
            let early = Early::begin(&dev, rows)?;
            let out = alloc::<T>(&dev, rows * c)?;
            early.launch()?;
            #[cfg(test)]
            super::EMBED_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: ids holds `rows` ids, wte V·C elements in whole 16-byte vectors from an
            // aligned start, wpe (where not null) its rows of C at every position in
            // `positions` (the caller's positions are below its length), w and b C each, out
            // rows·C; cv ≤ EMB_V·EMB_THREADS.
            launch!(unsafe func, cfg; &ids_a, &wte_a, &wpe_a, &pos_a, &w_a, &b_a, &out, &cv_i,
                &vocab_i, &eps)?;
            wrap(out, &dev, (rows, c))
        })))
    }
}
