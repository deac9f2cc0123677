//! Single-query attention over the KV cache (`--fused decode`; kernels in decode_attention.cu):
//! one new query per row against the cache, writing its own key and value into the cache,
//! heads merged on the way out ([`decode_attention`]); head sizes 64 and 128 take a block a
//! head where the heads fill the GPU and the cache holds at most 256 positions, else split
//! the keys over blocks and merge the blocks' partial results (flash-decoding). And the cache's
//! bookkeeping of a decode step replayed as a CUDA graph, at a position kept on the device
//! ([`decode_begin`]).
//!
//! Inference only (no backward). Shapes: `B` batch, `nh` heads, `hs` head size, `T_max`
//! positions the cache holds.

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

/// Launches of the cluster kernels in this process (a GPU test checks that they ran).
#[cfg(test)]
pub static CLUSTER_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Launches of the cache-first cluster kernels in this process (a GPU test checks which ran).
#[cfg(test)]
pub static CACHE_FIRST_LAUNCHES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

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
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{enabled, CacheSlot, Fused, QkvLayout};
    use crate::kernels::launch::{
        aligned16, alloc, cuda, float_dtype, kernel, launch, ptx, storage, suffix, view,
        with_dtype, wrap, Ptx, NULL,
    };
    use crate::kernels::pdl::{trigger_first_suffix, Early};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, LaunchArgs, LaunchConfig, PushKernelArg as _,
    };
    use candle_core::cuda_backend::{CudaDType, WrapErr as _};
    use candle_core::{DType, Layout, Result, StorageRef, Tensor};

    const PTX: Ptx = ptx!("decode_attention");

    /// Threads of a decode-attention block: a key each for the scores (≤ 512 keys in one
    /// sweep), 512 / hs groups of keys for p·v.
    const ATTN_THREADS: usize = 512;
    /// Keys a block of `tb_decode_attention_part` takes (SPLIT_KEYS of decode_attention.cu),
    /// its threads; those of `tb_decode_attention_head<hs>` (its HEAD_WARPS).
    const SPLIT_KEYS: usize = 64;
    const SPLIT_THREADS: u32 = 256;
    const HEAD_THREADS: u32 = 256;
    /// Where `tb_decode_attention_head<hs>` takes a call: from this many (row, head) pairs,
    /// about a block for each of an H100's 132 SMs (gpt2 at batch 16 has 192), and caches of
    /// at most HEAD_KEYS positions (a block walks them one round after another; measured at
    /// 129–256 keys: results/h100x2/attn1).
    const HEAD_PAIRS: usize = 128;
    const HEAD_KEYS: usize = 256;
    /// The dynamic shared memory a block may take without opting in (48 KiB).
    const SHARED_LIMIT: usize = 48 * 1024;

    /// Dynamic shared memory of a decode-attention block over `tk` keys, or None past the limit.
    fn attention_shared(hs: usize, tk: usize) -> Option<u32> {
        let bytes = (hs + tk + ATTN_THREADS) * 4;
        (bytes <= SHARED_LIMIT).then_some(bytes as u32)
    }

    /// Which kernel takes a call.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Kind {
        /// `tb_decode_attention`: a block a head, `shared` bytes for every key (head sizes
        /// other than 64 and 128).
        Whole,
        /// `tb_decode_attention_part` over `splits` blocks of SPLIT_KEYS keys (any length),
        /// then `tb_decode_combine`: head sizes 64 and 128 where the heads leave SMs idle.
        Split,
        /// `tb_decode_attention_head<hs>`: a block a head over all its keys, in 16-byte vectors
        /// (HEAD_PAIRS pairs or more, at most HEAD_KEYS keys), no merge kernel.
        Head,
        /// `tb_decode_attention_c<splits>`: Split's blocks as a thread-block cluster of 2, 4 or
        /// 8 that merges itself (`--fused cluster`, Hopper, caches of at most CLUSTER_KEYS).
        Cluster,
    }

    /// Keys up to which a head's splits take one cluster (8 blocks of SPLIT_KEYS: the largest
    /// portable cluster).
    const CLUSTER_KEYS: usize = 8 * SPLIT_KEYS;
    /// Rows up to which the splits take clusters: at one row gpt2, bloom-560m and bloom-7b1
    /// gained 8, 16 and 25 µs a step; bloom-560m at four rows lost 40 (0.943 → 0.983 ms, one
    /// H100, results/h100/diag-run47).
    const CLUSTER_ROWS: usize = 1;

    /// Whether the split blocks of `b` rows over a cache of `longest` keys on `qkv`'s device
    /// take a cluster.
    fn clustered(qkv: &Tensor, b: usize, longest: usize) -> Result<bool> {
        let on = enabled(Fused::Cluster) && qkv.device().is_cuda(); // the CPU: candle's ops
        if !on || longest > CLUSTER_KEYS || b > CLUSTER_ROWS {
            return Ok(false);
        }
        crate::kernels::pdl::hopper_ptx(qkv.device().as_cuda_device()?)
    }

    /// A call the kernels take: its shapes and the kernel's scalar arguments.
    struct Plan {
        /// Rows of qkv (B), and (row, head) pairs (B·nh).
        b: usize,
        rows: usize,
        kind: Kind,
        splits: usize,
        shared: u32,
        /// qkv's row stride; the layout's head stride and part; nh, hs, T_max, pos.
        stride: i64,
        ints: [i32; 2],
        dims: [i32; 4],
        scale: f32,
    }

    /// The shapes of a call, or None where the kernels do not apply (candle's ops run).
    fn plan(
        qkv: &Tensor,
        layout: QkvLayout,
        (nh, hs): (usize, usize),
        cache: &CacheSlot,
        slopes: Option<&Tensor>,
        scale: f64,
    ) -> Result<Option<Plan>> {
        let (b, t, width) = qkv.dims3()?;
        let (_, _, t_max, _) = cache.k.dims4()?;
        // With a cursor the position is known on the device only: room for every position.
        let longest = if cache.cursor.is_some() {
            t_max
        } else {
            cache.pos + 1
        };
        // Head sizes 64 and 128 split the keys over blocks at any length, or take a block a
        // head reading q, k and v in 16-byte vectors; the others need one block's shared
        // memory for every key.
        let size = qkv.dtype().size_in_bytes();
        let vectors = [width, layout.head_stride, layout.part]
            .iter()
            .all(|e| (e * size).is_multiple_of(16))
            && [qkv, cache.k, cache.v].into_iter().all(aligned16);
        let rows = b * nh;
        let kind = match matches!(hs, 64 | 128) {
            true if vectors && rows >= HEAD_PAIRS && longest <= HEAD_KEYS => Kind::Head,
            true => Kind::Split,
            false => Kind::Whole,
        };
        let kind = match kind {
            Kind::Split if clustered(qkv, b, longest)? => Kind::Cluster,
            other => other,
        };
        let shared = match (kind, attention_shared(hs, longest)) {
            (Kind::Whole, Some(bytes)) => bytes,
            (Kind::Whole, None) => return Ok(None), // longer than one block's shared memory holds
            _ => 0,
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
        Ok(Some(Plan {
            b,
            rows,
            kind,
            splits: match kind {
                Kind::Cluster => longest.div_ceil(SPLIT_KEYS).next_power_of_two().max(2),
                _ => longest.div_ceil(SPLIT_KEYS),
            },
            shared,
            stride: width as i64,
            ints: [layout.head_stride, layout.part].map(|v| v as i32),
            dims: [nh, hs, t_max, cache.pos].map(|v| v as i32),
            scale: scale as f32,
        }))
    }

    impl Plan {
        /// The attention kernel's grid: a block a (row, head), and a split of its keys.
        fn config(&self) -> LaunchConfig {
            let (splits, threads) = match self.kind {
                Kind::Split | Kind::Cluster => (self.splits as u32, SPLIT_THREADS),
                Kind::Head => (1, HEAD_THREADS),
                Kind::Whole => (1, ATTN_THREADS as u32),
            };
            LaunchConfig {
                grid_dim: (self.rows as u32, splits, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: self.shared,
            }
        }
    }

    /// The inputs' CUDA storages, read-locked while this lives: qkv, k, v, key_mask, key_pos;
    /// the slopes and the cursor where given.
    struct Guards<'a> {
        all: Vec<(StorageRef<'a>, &'a Layout)>,
        slopes: Option<(StorageRef<'a>, &'a Layout)>,
        cursor: Option<(StorageRef<'a>, &'a Layout)>,
    }

    /// The views the kernel reads, from [`Guards`].
    struct Views<'a, T> {
        qkv: CudaView<'a, T>,
        k: CudaView<'a, T>,
        v: CudaView<'a, T>,
        key_mask: CudaView<'a, f32>,
        key_pos: CudaView<'a, f32>,
        slopes: Option<CudaView<'a, f32>>,
        cursor: Option<CudaView<'a, u32>>,
    }

    impl<'a> Guards<'a> {
        /// None where one of them is not on a CUDA device.
        fn lock(
            qkv: &'a Tensor,
            cache: &CacheSlot<'a>,
            slopes: Option<&'a Tensor>,
        ) -> Option<Self> {
            let all = [qkv, cache.k, cache.v, cache.key_mask, cache.key_pos]
                .into_iter()
                .map(cuda)
                .collect::<Option<Vec<_>>>();
            let slopes = slopes.map(cuda);
            let cursor = cache.cursor.map(cuda);
            let missing = matches!(slopes, Some(None)) || matches!(cursor, Some(None));
            match (all, missing) {
                (Some(all), false) => Some(Self {
                    all,
                    slopes: slopes.flatten(),
                    cursor: cursor.flatten(),
                }),
                _ => None,
            }
        }

        fn views<T: CudaDType>(&self) -> Result<Views<'_, T>> {
            let g = &self.all;
            Ok(Views {
                qkv: view::<T>(storage(&g[0].0), g[0].1)?,
                k: view::<T>(storage(&g[1].0), g[1].1)?,
                v: view::<T>(storage(&g[2].0), g[2].1)?,
                key_mask: view::<f32>(storage(&g[3].0), g[3].1)?,
                key_pos: view::<f32>(storage(&g[4].0), g[4].1)?,
                slopes: match &self.slopes {
                    Some((s, l)) => Some(view::<f32>(storage(s), l)?),
                    None => None,
                },
                cursor: match &self.cursor {
                    Some((c, l)) => Some(view::<u32>(storage(c), l)?),
                    None => None,
                },
            })
        }
    }

    /// The split blocks' partial results: max and exp-sum (rows·splits), p·v (· hs).
    struct Partials {
        m: CudaSlice<f32>,
        l: CudaSlice<f32>,
        acc: CudaSlice<f32>,
    }

    /// The attention kernel's arguments, in its parameter order: into `out`, or into the
    /// split blocks' partials.
    fn push_args<'a, T>(
        args: &mut LaunchArgs<'a>,
        p: &'a Plan,
        v: &'a Views<'_, T>,
        parts: Option<&'a Partials>,
        out: &'a CudaSlice<T>,
    ) {
        args.arg(&v.qkv)
            .arg(&p.stride)
            .arg(&p.ints[0])
            .arg(&p.ints[1]);
        args.arg(&v.k).arg(&v.v).arg(&v.key_mask);
        match &v.slopes {
            Some(s) => args.arg(s),
            None => args.arg(&NULL),
        };
        args.arg(&v.key_pos);
        match parts {
            Some(parts) => args.arg(&parts.m).arg(&parts.l).arg(&parts.acc),
            None => args.arg(out),
        };
        args.arg(&p.scale).arg(&p.dims[0]);
        if p.kind != Kind::Head {
            args.arg(&p.dims[1]); // hs: the head kernels have it in their names
        }
        args.arg(&p.dims[2]).arg(&p.dims[3]);
        match &v.cursor {
            Some(c) => args.arg(c),
            None => args.arg(&NULL),
        };
    }

    /// The cluster kernel's name: `tb_decode_attention_cf<splits>_h<hs>` with `cache-first`
    /// where the caches start 16-byte aligned (it loads a lane's run of a cached row as one
    /// word), else `tb_decode_attention_c<splits>`.
    fn cluster_kernel(p: &Plan, hs: usize, cache: &CacheSlot, dtype: &str) -> String {
        let aligned = aligned16(cache.k) && aligned16(cache.v);
        match enabled(Fused::CacheFirst) && aligned {
            true => format!("tb_decode_attention_cf{}_h{hs}_{dtype}", p.splits),
            false => format!("tb_decode_attention_c{}_{dtype}", p.splits),
        }
    }

    pub fn decode_attention(
        qkv: &Tensor,
        layout: QkvLayout,
        (nh, hs): (usize, usize),
        cache: &CacheSlot,
        slopes: Option<&Tensor>,
        scale: f64,
    ) -> Result<Option<Tensor>> {
        let Some(p) = plan(qkv, layout, (nh, hs), cache, slopes, scale)? else {
            return Ok(None);
        };
        let Some(g) = Guards::lock(qkv, cache, slopes) else {
            return Ok(None);
        };
        let dev = storage(&g.all[0].0).device().clone();
        let func = match (p.kind, hs) {
            (Kind::Split, _) => kernel!(dev, PTX, "tb_decode_attention_part", qkv.dtype())?,
            (Kind::Cluster, _) => {
                #[cfg(test)]
                super::CLUSTER_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let name = cluster_kernel(&p, hs, cache, suffix(qkv.dtype())?);
                #[cfg(test)]
                if name.starts_with("tb_decode_attention_cf") {
                    super::CACHE_FIRST_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?
            }
            (Kind::Head, 64) => kernel!(dev, PTX, "tb_decode_attention_head64", qkv.dtype())?,
            (Kind::Head, _) => kernel!(dev, PTX, "tb_decode_attention_head128", qkv.dtype())?,
            (Kind::Whole, _) => kernel!(dev, PTX, "tb_decode_attention", qkv.dtype())?,
        };
        // The split blocks' partial results and the kernel that merges them.
        let early = Early::begin(&dev, p.b)?;
        let parts = match p.kind == Kind::Split {
            true => Some((
                Partials {
                    m: alloc::<f32>(&dev, p.rows * p.splits)?,
                    l: alloc::<f32>(&dev, p.rows * p.splits)?,
                    acc: alloc::<f32>(&dev, p.rows * p.splits * hs)?,
                },
                {
                    let (tf, s) = (trigger_first_suffix(), suffix(qkv.dtype())?);
                    let name = format!("tb_decode_combine{tf}_{s}");
                    dev.get_or_load_custom_func(&name, PTX.module, PTX.text)?
                },
            )),
            false => None,
        };
        let out = with_dtype!(qkv.dtype(), T => {
            let views = g.views::<T>()?;
            let out = alloc::<T>(&dev, p.rows * hs)?;
            let mut args = func.builder();
            push_args(&mut args, &p, &views, parts.as_ref().map(|(m, _)| m), &out);
            early.launch()?;
            // SAFETY: qkv holds B rows of `width` ≥ every head's q, k and v (the layout); the
            // caches (B, nh, T_max, hs) with pos < T_max (a cursor's too: generate_in made
            // the cache with room for every step); mask and positions (B, T_max); out B·nh·hs;
            // slopes nh; shared memory for every key, or the partials for every split of
            // SPLIT_KEYS keys of the longest cache; the head kernel's 16-byte vectors start at
            // 16-byte boundaries (qkv, k and v aligned, width, head stride and part whole
            // vectors: plan). The kernel writes the caches only at `pos`.
            unsafe { args.launch(p.config()) }.w()?;
            if let Some((m, combine)) = &parts {
                let (splits_i, hs_i) = (p.splits as i32, hs as i32);
                let cfg = LaunchConfig {
                    grid_dim: (p.rows as u32, 1, 1),
                    block_dim: (hs as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                Early::begin(&dev, p.b)?.launch()?;
                // SAFETY: the partials hold rows·splits (·hs) values, out rows·hs.
                launch!(unsafe combine, cfg; &m.m, &m.l, &m.acc, &out, &splits_i, &hs_i)?;
            }
            wrap(out, &dev, (p.b, 1, nh * hs))
        });
        Ok(Some(out))
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
        let early = Early::begin(&dev, b)?;
        let positions = alloc::<f32>(&dev, b)?;
        let (b_i, t_i) = (b as i32, t_max as i32);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (b.next_power_of_two().clamp(32, 1024) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        early.launch()?;
        // SAFETY: mask and key_pos hold B·T_max elements, seen and positions B, the cursor one,
        // below T_max: generate_in made the cache with room for every step it replays.
        launch!(unsafe func, cfg; &mv, &pv, &sv, &positions, &cv, &b_i, &t_i)?;
        Ok(Some(wrap(positions, &dev, (b, 1))))
    }
}
