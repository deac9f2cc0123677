//! Decode kernels (`--fused decode`; kernels in decode.cu): what a generated token's forward
//! launched ≈ 190 times (docs/perf-notes.md, "Generation"), fewer and larger:
//! - [`add_layer_norm`]: the residual add and the next LayerNorm in one pass;
//! - [`decode_attention`]: one new query per row against the KV cache, writing its own key
//!   and value into the cache, heads merged on the way out;
//! - [`argmax`]: the greedy pick over the vocabulary, banned ids excluded.
//!
//! Inference only (no backward). Shapes: `B` batch, `nh` heads, `hs` head size, `C` channels,
//! `T_max` positions the cache holds, `V` vocabulary.

use super::{enabled, Fused};
use candle_core::{Result, Tensor};

/// Where a head's q, k and v sit in a row of the fused qkv projection's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvLayout {
    /// Elements from head h's q to head h + 1's (GPT-2 [q | k | v]: hs; BLOOM (nh, 3, hs): 3·hs).
    pub head_stride: usize,
    /// Elements from a head's q to its k, and from its k to its v (GPT-2: C; BLOOM: hs).
    pub part: usize,
}

/// A layer's KV cache as the decode kernel reads and writes it.
pub struct CacheSlot<'a> {
    /// Keys and values, (B, nh, T_max, hs) each, contiguous.
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// (B, T_max) f32: 1 real token, 0 padding, written up to and including `pos`.
    pub key_mask: &'a Tensor,
    /// (B, T_max) f32: each key's position (BLOOM's ALiBi reads it).
    pub key_pos: &'a Tensor,
    /// Where the new key and value go; keys `0..=pos` are attended.
    pub pos: usize,
    /// (1,) u32 on the device, positions written after this step: when given, the kernel
    /// reads its position there (`pos` is ignored), so that a CUDA graph replays the step.
    pub cursor: Option<&'a Tensor>,
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

/// Attention of one new position per row: qkv (B, 1, ·) the fused projection's output laid out
/// as `layout` says, `nh` heads of `hs`; the new key and value are written into `cache` at
/// `cache.pos`. `slopes` (nh,) f32: BLOOM's ALiBi. Returns (B, 1, nh·hs), heads merged.
pub fn decode_attention(
    qkv: &Tensor,
    layout: QkvLayout,
    (nh, hs): (usize, usize),
    cache: &CacheSlot,
    slopes: Option<&Tensor>,
    scale: f64,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::Decode) {
        return Ok(None);
    }
    imp::decode_attention(qkv, layout, (nh, hs), cache, slopes, scale)
}

/// The first index of each row's largest logit + `ban` ((1, V) 0 or −inf, the logits' dtype):
/// logits (B, V) -> (B, 1) u32, as `argmax_keepdim(1)` of the sum.
pub fn argmax(logits: &Tensor, ban: Option<&Tensor>) -> Result<Option<Tensor>> {
    if !enabled(Fused::Decode) {
        return Ok(None);
    }
    imp::argmax(logits, ban)
}

/// One decode step's cache bookkeeping at the device-side `cursor` ((1,) u32, advanced):
/// `mask` and `key_pos` ((B, T_max) f32) get each row's new real token at the cursor, `seen`
/// ((B, 1) f32, real tokens per row) advances. Returns the new tokens' positions, (B, 1) f32.
pub fn decode_begin(
    mask: &Tensor,
    key_pos: &Tensor,
    seen: &Tensor,
    cursor: &Tensor,
) -> Result<Option<Tensor>> {
    if !enabled(Fused::Decode) {
        return Ok(None);
    }
    imp::decode_begin(mask, key_pos, seen, cursor)
}

/// The CPU runs candle's composed ops.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{CacheSlot, QkvLayout};
    use candle_core::{Result, Tensor};

    pub fn decode_begin(_: &Tensor, _: &Tensor, _: &Tensor, _: &Tensor) -> Result<Option<Tensor>> {
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

    pub fn decode_attention(
        _: &Tensor,
        _: QkvLayout,
        _: (usize, usize),
        _: &CacheSlot,
        _: Option<&Tensor>,
        _: f64,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    pub fn argmax(_: &Tensor, _: Option<&Tensor>) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{CacheSlot, QkvLayout};
    use crate::kernels::launch::{
        aligned16, alloc, float_dtype, kernel, launch, ptx, view, with_dtype, Ptx, NULL,
    };
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg as _};
    use candle_core::cuda_backend::{CudaDType, WrapErr as _};
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Layout, Result, Shape, Storage, StorageRef, Tensor};

    const PTX: Ptx = ptx!("decode");

    /// Threads of a decode-attention block: a key each for the scores (≤ 512 keys in one
    /// sweep), 512 / hs groups of keys for p·v.
    const ATTN_THREADS: usize = 512;
    /// Keys a block of `tb_decode_attention_part` takes (SPLIT_KEYS of decode.cu), its threads.
    const SPLIT_KEYS: usize = 64;
    const SPLIT_THREADS: u32 = 256;
    /// The dynamic shared memory a block may take without opting in (48 KiB).
    const SHARED_LIMIT: usize = 48 * 1024;

    /// A tensor's CUDA storage, read-locked while the guard lives; None on another device.
    fn cuda(t: &Tensor) -> Option<(StorageRef<'_>, &Layout)> {
        let (s, l) = t.storage_and_layout();
        matches!(&*s, Storage::Cuda(_)).then_some((s, l))
    }

    fn storage<'a>(s: &'a StorageRef<'_>) -> &'a CudaStorage {
        match &**s {
            Storage::Cuda(c) => c,
            _ => unreachable!("checked by cuda()"),
        }
    }

    /// A new tensor over `slice`, shape `shape`, outside autograd.
    fn wrap<T: CudaDType>(
        slice: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
        dev: &candle_core::CudaDevice,
        shape: impl Into<Shape>,
    ) -> Tensor {
        let s = Storage::Cuda(T::wrap_cuda_slice(slice, dev.clone()));
        Tensor::from_storage(s, shape, BackpropOp::none(), false)
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
        let func = kernel!(dev, PTX, "tb_add_layer_norm", x.dtype())?;
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
            let (s, y) = (alloc::<T>(&dev, rows * c)?, alloc::<T>(&dev, rows * c)?);
            let (c_i, eps, vec_i) = (c as i32, eps as f32, vec as i32);
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x, r, s and y hold rows·C elements, w and b C; with `vec`, C / 8 (bf16)
            // or C / 4 (f32) vectors a row, at most one a thread, from 16-byte boundaries.
            launch!(unsafe func, cfg; &xv, &rv, &wv, &bv, &s, &y, &c_i, &eps, &vec_i)?;
            (wrap(s, &dev, x.shape()), wrap(y, &dev, x.shape()))
        });
        Ok(Some((sum, normed)))
    }

    /// Dynamic shared memory of a decode-attention block over `tk` keys, or None past the limit.
    fn attention_shared(hs: usize, tk: usize) -> Option<u32> {
        let bytes = (hs + tk + ATTN_THREADS) * 4;
        (bytes <= SHARED_LIMIT).then_some(bytes as u32)
    }

    pub fn decode_attention(
        qkv: &Tensor,
        layout: QkvLayout,
        (nh, hs): (usize, usize),
        cache: &CacheSlot,
        slopes: Option<&Tensor>,
        scale: f64,
    ) -> Result<Option<Tensor>> {
        let (b, t, width) = qkv.dims3()?;
        let (_, _, t_max, _) = cache.k.dims4()?;
        // With a cursor the position is known on the device only: room for every position.
        let longest = if cache.cursor.is_some() {
            t_max
        } else {
            cache.pos + 1
        };
        // Head sizes 64 and 128 split the keys over blocks, at any length; the others need one
        // block's shared memory for every key.
        let split = matches!(hs, 64 | 128);
        let shared = match (split, attention_shared(hs, longest)) {
            (true, _) => 0,
            (false, Some(bytes)) => bytes,
            (false, None) => return Ok(None), // longer than one block's shared memory holds
        };
        let fits = t == 1 && hs <= ATTN_THREADS && cache.pos < t_max;
        let cursor_ok = cache
            .cursor
            .is_none_or(|c| c.dtype() == DType::U32 && c.dims() == [1]);
        let kinds = cache.k.dtype() == qkv.dtype() && cache.v.dtype() == qkv.dtype();
        let f32s = [cache.key_mask, cache.key_pos]
            .iter()
            .all(|m| m.dtype() == DType::F32)
            && slopes.is_none_or(|s| s.dtype() == DType::F32 && s.dims() == [nh]);
        let layouts = [cache.k, cache.v, cache.key_mask, cache.key_pos, qkv]
            .iter()
            .all(|t| t.is_contiguous());
        if !qkv.device().is_cuda() || !float_dtype(qkv) || !fits || !kinds || !f32s || !layouts {
            return Ok(None);
        }
        if !cursor_ok {
            return Ok(None);
        }
        if cache.k.dims4()? != (b, nh, t_max, hs) || cache.key_mask.dims2()? != (b, t_max) {
            return Ok(None);
        }
        let guards = [qkv, cache.k, cache.v, cache.key_mask, cache.key_pos]
            .into_iter()
            .map(cuda)
            .collect::<Option<Vec<_>>>();
        let slope_guard = slopes.map(cuda);
        let cursor_guard = cache.cursor.map(cuda);
        let missing = matches!(slope_guard, Some(None)) || matches!(cursor_guard, Some(None));
        let (Some(g), false) = (guards, missing) else {
            return Ok(None);
        };
        let dev = storage(&g[0].0).device().clone();
        let func = match split {
            true => kernel!(dev, PTX, "tb_decode_attention_part", qkv.dtype())?,
            false => kernel!(dev, PTX, "tb_decode_attention", qkv.dtype())?,
        };
        // The split blocks' partial results: max and exp-sum (rows·splits), p·v (· hs), and
        // the kernel that merges them.
        let (rows, splits) = (b * nh, longest.div_ceil(SPLIT_KEYS));
        let parts = match split {
            true => Some((
                alloc::<f32>(&dev, rows * splits)?,
                alloc::<f32>(&dev, rows * splits)?,
                alloc::<f32>(&dev, rows * splits * hs)?,
                kernel!(dev, PTX, "tb_decode_combine", qkv.dtype())?,
            )),
            false => None,
        };
        let out = with_dtype!(qkv.dtype(), T => {
            let qv = view::<T>(storage(&g[0].0), g[0].1)?;
            let kv = view::<T>(storage(&g[1].0), g[1].1)?;
            let vv = view::<T>(storage(&g[2].0), g[2].1)?;
            let mv = view::<f32>(storage(&g[3].0), g[3].1)?;
            let pv = view::<f32>(storage(&g[4].0), g[4].1)?;
            let sv = match &slope_guard {
                Some(Some((s, l))) => Some(view::<f32>(storage(s), l)?),
                _ => None,
            };
            let out = alloc::<T>(&dev, b * nh * hs)?;
            let stride = width as i64;
            let ints = [layout.head_stride, layout.part].map(|v| v as i32);
            let dims = [nh, hs, t_max, cache.pos].map(|v| v as i32);
            let scale = scale as f32;
            let mut args = func.builder();
            args.arg(&qv).arg(&stride).arg(&ints[0]).arg(&ints[1]).arg(&kv).arg(&vv).arg(&mv);
            match &sv {
                Some(s) => args.arg(s),
                None => args.arg(&NULL),
            };
            args.arg(&pv);
            match &parts {
                Some((m, l, acc, _)) => args.arg(m).arg(l).arg(acc),
                None => args.arg(&out),
            };
            args.arg(&scale);
            for d in &dims {
                args.arg(d);
            }
            let cv = match &cursor_guard {
                Some(Some((c, l))) => Some(view::<u32>(storage(c), l)?),
                _ => None,
            };
            match &cv {
                Some(c) => args.arg(c),
                None => args.arg(&NULL),
            };
            let cfg = match split {
                true => LaunchConfig {
                    grid_dim: (rows as u32, splits as u32, 1),
                    block_dim: (SPLIT_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                },
                false => LaunchConfig {
                    grid_dim: (rows as u32, 1, 1),
                    block_dim: (ATTN_THREADS as u32, 1, 1),
                    shared_mem_bytes: shared,
                },
            };
            // SAFETY: qkv holds B rows of `width` ≥ every head's q, k and v (the layout); the
            // caches (B, nh, T_max, hs) with pos < T_max (a cursor's too: generate_in made
            // the cache with room for every step); mask and positions (B, T_max); out B·nh·hs;
            // slopes nh; shared memory for every key, or the partials for every split of
            // SPLIT_KEYS keys of the longest cache. The kernel writes the caches only at `pos`.
            unsafe { args.launch(cfg) }.w()?;
            if let Some((m, l, acc, combine)) = &parts {
                let (splits_i, hs_i) = (splits as i32, hs as i32);
                let cfg = LaunchConfig {
                    grid_dim: (rows as u32, 1, 1),
                    block_dim: (hs as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the partials hold rows·splits (·hs) values, out rows·hs.
                launch!(unsafe combine, cfg; m, l, acc, &out, &splits_i, &hs_i)?;
            }
            wrap(out, &dev, (b, 1, nh * hs))
        });
        Ok(Some(out))
    }

    pub fn argmax(logits: &Tensor, ban: Option<&Tensor>) -> Result<Option<Tensor>> {
        let (b, v) = logits.dims2()?;
        let ban_ok = ban.is_none_or(|t| t.dtype() == logits.dtype() && t.elem_count() == v);
        if !logits.device().is_cuda() || !float_dtype(logits) || !ban_ok {
            return Ok(None);
        }
        let x = logits.contiguous()?;
        let ban = ban.map(|t| t.contiguous()).transpose()?;
        let Some(xs) = cuda(&x) else {
            return Ok(None);
        };
        let bs = match &ban {
            Some(t) => match cuda(t) {
                Some(g) => Some(g),
                None => return Ok(None),
            },
            None => None,
        };
        let dev = storage(&xs.0).device().clone();
        if v > ARGMAX_ONE_BLOCK {
            return argmax_split(&x, xs, bs.as_ref(), (b, v)).map(Some);
        }
        let func = kernel!(dev, PTX, "tb_argmax", x.dtype())?;
        let out = with_dtype!(x.dtype(), T => {
            let xv = view::<T>(storage(&xs.0), xs.1)?;
            let bv = bs.as_ref().map(|(s, l)| view::<T>(storage(s), l)).transpose()?;
            let out = alloc::<u32>(&dev, b)?;
            let v_i = v as i32;
            let mut args = func.builder();
            args.arg(&xv);
            match &bv {
                Some(bv) => args.arg(bv),
                None => args.arg(&NULL),
            };
            args.arg(&out).arg(&v_i);
            let cfg = LaunchConfig {
                grid_dim: (b as u32, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x holds B·V elements, ban V, out B.
            unsafe { args.launch(cfg) }.w()?;
            wrap(out, &dev, (b, 1))
        });
        Ok(Some(out))
    }

    /// Rows longer than this are split over blocks (`tb_argmax_part`, then `tb_argmax_final`).
    const ARGMAX_ONE_BLOCK: usize = 16384;
    /// Columns a block of `tb_argmax_part`.
    const ARGMAX_CHUNK: usize = 2048;

    /// The greedy pick of long rows in two launches: each block the best of a chunk, then each
    /// row the best of its chunks.
    fn argmax_split(
        x: &Tensor,
        xs: (StorageRef<'_>, &Layout),
        ban: Option<&(StorageRef<'_>, &Layout)>,
        (b, v): (usize, usize),
    ) -> Result<Tensor> {
        let dev = storage(&xs.0).device().clone();
        let part = kernel!(dev, PTX, "tb_argmax_part", x.dtype())?;
        let fin = dev.get_or_load_custom_func("tb_argmax_final", PTX.module, PTX.text)?;
        let chunks = v.div_ceil(ARGMAX_CHUNK);
        let (part_v, part_i) = (
            alloc::<f32>(&dev, b * chunks)?,
            alloc::<i32>(&dev, b * chunks)?,
        );
        let out = alloc::<u32>(&dev, b)?;
        with_dtype!(x.dtype(), T => {
            let xv = view::<T>(storage(&xs.0), xs.1)?;
            let bv = ban.map(|(s, l)| view::<T>(storage(s), l)).transpose()?;
            let (v_i, chunk_i) = (v as i32, ARGMAX_CHUNK as i32);
            let mut args = part.builder();
            args.arg(&xv);
            match &bv {
                Some(bv) => args.arg(bv),
                None => args.arg(&NULL),
            };
            args.arg(&part_v).arg(&part_i).arg(&v_i).arg(&chunk_i);
            let cfg = LaunchConfig {
                grid_dim: (chunks as u32, b as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x holds B·V elements, ban V, the partials B·chunks.
            unsafe { args.launch(cfg) }.w()?;
        });
        let chunks_i = chunks as i32;
        let cfg = LaunchConfig {
            grid_dim: (b as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the partials hold B·chunks values, out B.
        launch!(unsafe fin, cfg; &part_v, &part_i, &out, &chunks_i)?;
        Ok(wrap(out, &dev, (b, 1)))
    }

    pub fn decode_begin(
        mask: &Tensor,
        key_pos: &Tensor,
        seen: &Tensor,
        cursor: &Tensor,
    ) -> Result<Option<Tensor>> {
        let (b, t_max) = mask.dims2()?;
        let f32s = [mask, key_pos, seen]
            .iter()
            .all(|t| t.dtype() == DType::F32);
        let shapes =
            key_pos.dims2()? == (b, t_max) && seen.elem_count() == b && cursor.dims() == [1];
        let layouts = [mask, key_pos, seen, cursor]
            .iter()
            .all(|t| t.is_contiguous());
        if !mask.device().is_cuda() || !f32s || cursor.dtype() != DType::U32 || !shapes || !layouts
        {
            return Ok(None);
        }
        let guards = [mask, key_pos, seen, cursor]
            .into_iter()
            .map(cuda)
            .collect::<Option<Vec<_>>>();
        let Some(g) = guards else {
            return Ok(None);
        };
        let dev = storage(&g[0].0).device().clone();
        let func = dev.get_or_load_custom_func("tb_decode_begin", PTX.module, PTX.text)?;
        let mv = view::<f32>(storage(&g[0].0), g[0].1)?;
        let pv = view::<f32>(storage(&g[1].0), g[1].1)?;
        let sv = view::<f32>(storage(&g[2].0), g[2].1)?;
        let cv = view::<u32>(storage(&g[3].0), g[3].1)?;
        let positions = alloc::<f32>(&dev, b)?;
        let (b_i, t_i) = (b as i32, t_max as i32);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (b.next_power_of_two().clamp(32, 1024) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: mask and key_pos hold B·T_max elements, seen and positions B, the cursor one,
        // below T_max: generate_in made the cache with room for every step it replays.
        launch!(unsafe func, cfg; &mv, &pv, &sv, &positions, &cv, &b_i, &t_i)?;
        Ok(Some(wrap(positions, &dev, (b, 1))))
    }
}
