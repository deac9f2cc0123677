//! A decode step's blocks in one persistent kernel (`--fused step`, #37; kernel in
//! decode_step.cu): one block an SM runs every layer's five stages (qkv, attention, proj +
//! residual, fc + GELU, fc2 + residual, each LayerNorm inside the projection after it) with
//! grid-wide barriers between them, and streams each stage's weights into shared memory two
//! stages ahead. A batch-1 gpt2 step was ≈ 100 launches whose gaps and ramps cost more than
//! their bytes (docs/perf-notes.md).
//!
//! Inference, 1–4 rows, pre-LayerNorm GPT-2 / BLOOM blocks with a tanh GELU, bf16 / f16 / f32.
//! Shapes: `M` rows, `C` channels, `I` the MLP's inner size, `L` layers.

use super::{enabled, CacheSlot, Fused, QkvLayout};
use candle_core::{Result, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rows (one new position each) the kernel takes.
pub const STEP_MAX_ROWS: usize = 4;

/// Launches of the kernel in this process, replays of a graph that holds it not counted (the
/// tests tell a step the kernel ran from one the layers ran by it).
static LAUNCHES: AtomicUsize = AtomicUsize::new(0);

pub fn step_launches() -> usize {
    LAUNCHES.load(Ordering::Relaxed)
}

/// One block's weights as the step reads them, each in the model's dtype and contiguous:
/// LayerNorm (weight, bias) (C,) each; projections nn.Linear (out, in) with their biases.
pub struct StepLayer {
    pub ln1: (Tensor, Tensor),
    /// (3C, C), output laid out as the attention's [`QkvLayout`] says.
    pub qkv: (Tensor, Tensor),
    /// (C, C)
    pub proj: (Tensor, Tensor),
    pub ln2: (Tensor, Tensor),
    /// (I, C), GELU (tanh) after.
    pub fc: (Tensor, Tensor),
    /// (C, I)
    pub fc2: (Tensor, Tensor),
}

/// The attention's constants: heads, the qkv layout, the score scale, ALiBi slopes (nh,) f32.
pub struct StepAttention {
    pub nh: usize,
    pub hs: usize,
    pub layout: QkvLayout,
    pub scale: f64,
    pub slopes: Option<Tensor>,
}

/// What stays from step to step: the weights and their table on the device, the final
/// LayerNorm, the barrier's counters. Built once a model ([`StepModel::new`]).
pub struct StepModel {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    inner: imp::Inner,
}

impl StepModel {
    /// None where the kernel does not apply: the CPU, `step` switched off, a dtype other
    /// than f32 / bf16 / f16, more than 64 layers, sizes the kernel's 16-byte loads or its
    /// norms do not take (shared memory, which grows with the rows and the cache, is
    /// [`StepModel::applies`]'s).
    pub fn new(
        layers: Vec<StepLayer>,
        lnf: (Tensor, Tensor),
        eps: f64,
        attention: StepAttention,
    ) -> Result<Option<Self>> {
        if !enabled(Fused::Step) {
            return Ok(None);
        }
        Ok(imp::Inner::new(layers, lnf, eps, attention)?.map(|inner| Self { inner }))
    }

    /// Whether [`StepModel::forward`] takes `rows` rows against caches of `t_max` positions
    /// (its shared memory grows with both).
    pub fn applies(&self, rows: usize, t_max: usize) -> bool {
        self.inner.applies(rows, t_max)
    }

    /// LN_f of the blocks over x (M, 1, C), the residual stream entering layer 0, one new
    /// position a row whose keys and values go into `slots` (a layer each): (M, 1, C). None
    /// where the kernel does not apply (more rows, a cache longer than its shared memory).
    pub fn forward(&self, x: &Tensor, slots: &[CacheSlot]) -> Result<Option<Tensor>> {
        if !enabled(Fused::Step) {
            return Ok(None);
        }
        let out = self.inner.forward(x, slots)?;
        if out.is_some() {
            LAUNCHES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{CacheSlot, StepAttention, StepLayer};
    use candle_core::{Result, Tensor};

    pub struct Inner;

    impl Inner {
        pub fn new(
            _: Vec<StepLayer>,
            _: (Tensor, Tensor),
            _: f64,
            _: StepAttention,
        ) -> Result<Option<Self>> {
            Ok(None)
        }

        pub fn applies(&self, _: usize, _: usize) -> bool {
            false
        }

        pub fn forward(&self, _: &Tensor, _: &[CacheSlot]) -> Result<Option<Tensor>> {
            Ok(None)
        }
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{CacheSlot, StepAttention, StepLayer, STEP_MAX_ROWS};
    use crate::kernels::launch::{
        alloc, device_address, kernel, launch, ptx, with_dtype, wrap, Ptx, NULL,
    };
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUdevice_attribute, CUfunction_attribute_enum, CUstreamCaptureStatus,
    };
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig};
    use candle_core::cuda_backend::WrapErr as _;
    use candle_core::{bail, CudaDevice, DType, Device, Result, Tensor};

    const PTX: Ptx = ptx!("decode_step");
    /// decode_step.cu's STEP_THREADS and STEP_MAX_LAYERS.
    const THREADS: usize = 512;
    const MAX_LAYERS: usize = 64;
    /// The LayerNorms keep a row in registers, 8 values a thread.
    const MAX_NORMED: usize = 8 * THREADS;

    /// decode_step.cu's StepCaches.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct StepCaches {
        k: [u64; MAX_LAYERS],
        v: [u64; MAX_LAYERS],
    }
    // SAFETY: plain old data with the C layout the kernel declares.
    unsafe impl DeviceRepr for StepCaches {}

    /// decode_step.cu's StepDims.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct StepDims {
        n_layer: i32,
        c: i32,
        inner: i32,
        nh: i32,
        hs: i32,
        t_max: i32,
        head_stride: i32,
        part: i32,
        pos: i32,
        splits: i32,
        eps: f32,
        scale: f32,
        wbuf: i32,
        off_x: i32,
        off_part: i32,
        off_p: i32,
        off_acc: i32,
        off_q: i32,
        off_w: i32,
        off_bias: i32,
        off_res: i32,
    }
    // SAFETY: as StepCaches.
    unsafe impl DeviceRepr for StepDims {}

    pub struct Inner {
        /// Kept alive: the table holds their addresses.
        _layers: Vec<StepLayer>,
        /// (L·12,) u64 as (L·24,) u32: decode_step.cu's LayerW, a row a layer.
        table: Tensor,
        lnf: (Tensor, Tensor),
        attention: StepAttention,
        /// (2,) u32, zero between launches: the grid barrier's counters.
        sync: Tensor,
        dims: StepDims,
        dtype: DType,
        dev: CudaDevice,
        /// The grid: one block an SM.
        sms: usize,
        /// Shared memory a block can have (the opt-in maximum).
        smem_max: usize,
    }

    fn round_up(v: usize, to: usize) -> usize {
        v.div_ceil(to) * to
    }

    /// The weights' addresses, a row of 12 a layer (LayerW's order), as u32 pairs.
    fn table(layers: &[StepLayer], device: &Device) -> Result<Tensor> {
        let mut words = Vec::with_capacity(layers.len() * 24);
        for l in layers {
            for t in [&l.ln1, &l.qkv, &l.proj, &l.ln2, &l.fc, &l.fc2] {
                for part in [&t.0, &t.1] {
                    let a = device_address(part)?;
                    words.extend([a as u32, (a >> 32) as u32]);
                }
            }
        }
        Tensor::from_vec(words, layers.len() * 24, device)
    }

    /// A layer's tensors beside the shapes the kernel reads them in.
    fn shapes(l: &StepLayer, c: usize, i: usize) -> [(&Tensor, Vec<usize>); 12] {
        [
            (&l.ln1.0, vec![c]),
            (&l.ln1.1, vec![c]),
            (&l.qkv.0, vec![3 * c, c]),
            (&l.qkv.1, vec![3 * c]),
            (&l.proj.0, vec![c, c]),
            (&l.proj.1, vec![c]),
            (&l.ln2.0, vec![c]),
            (&l.ln2.1, vec![c]),
            (&l.fc.0, vec![i, c]),
            (&l.fc.1, vec![i]),
            (&l.fc2.0, vec![c, i]),
            (&l.fc2.1, vec![c]),
        ]
    }

    /// Whether every weight has the shape, dtype and 16-byte alignment the kernel reads.
    fn fits(
        layers: &[StepLayer],
        lnf: &(Tensor, Tensor),
        c: usize,
        i: usize,
        dtype: DType,
    ) -> bool {
        let ok = |t: &Tensor, dims: &[usize]| {
            t.dims() == dims && t.dtype() == dtype && crate::kernels::launch::aligned16(t)
        };
        let norm = ok(&lnf.0, &[c]) && ok(&lnf.1, &[c]);
        norm && layers
            .iter()
            .all(|l| shapes(l, c, i).iter().all(|(t, d)| ok(t, d)))
    }

    /// With TB_STEP_TRACE=<file> (a step run now, not one a graph records): a zeroed buffer
    /// for the kernel's per-block times, (2 + 20·L, grid) u64 as u32 pairs, and the file.
    fn trace_buffer(grid: usize, n_layer: usize, x: &Tensor) -> Result<Option<(Tensor, String)>> {
        let Ok(path) = std::env::var("TB_STEP_TRACE") else {
            return Ok(None);
        };
        let Device::Cuda(dev) = x.device() else {
            return Ok(None);
        };
        let capturing = dev.cuda_stream().capture_status().w()?;
        if capturing != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(None);
        }
        let words = 2 * (2 + 20 * n_layer) * grid;
        Ok(Some((Tensor::zeros(words, DType::U32, x.device())?, path)))
    }

    /// The trace as little-endian u64s after a header of two: the grid and the layers
    /// (scripts/step_trace.py reads it); each traced step overwrites the last.
    fn write_trace(t: &Tensor, path: &str, grid: usize, n_layer: usize) -> Result<()> {
        let words = t.to_vec1::<u32>()?;
        let mut bytes = Vec::with_capacity(words.len() * 4 + 16);
        bytes.extend((grid as u64).to_le_bytes());
        bytes.extend((n_layer as u64).to_le_bytes());
        words.iter().for_each(|w| bytes.extend(w.to_le_bytes()));
        std::fs::write(path, bytes).map_err(candle_core::Error::wrap)
    }

    impl Inner {
        pub fn new(
            layers: Vec<StepLayer>,
            lnf: (Tensor, Tensor),
            eps: f64,
            attention: StepAttention,
        ) -> Result<Option<Self>> {
            let Device::Cuda(dev) = lnf.0.device().clone() else {
                return Ok(None);
            };
            let dtype = lnf.0.dtype();
            let Some(first) = layers.first() else {
                return Ok(None);
            };
            let (c, i) = (first.ln1.0.dim(0)?, first.fc.0.dim(0)?);
            let (size, hs) = (dtype.size_in_bytes(), attention.hs);
            let supported = matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
                && layers.len() <= MAX_LAYERS
                && c <= MAX_NORMED
                && (c * size).is_multiple_of(16)
                && (i * size).is_multiple_of(16)
                && (hs * size).is_multiple_of(16)
                && hs <= THREADS
                && attention.nh * hs == c;
            if !supported || !fits(&layers, &lnf, c, i, dtype) {
                return Ok(None);
            }
            let ctx = dev.cuda_stream().context().clone();
            let attr = |a| ctx.attribute(a).w().map(|v| v as usize);
            let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let smem_max =
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
            let dims = StepDims {
                n_layer: layers.len() as i32,
                c: c as i32,
                inner: i as i32,
                nh: attention.nh as i32,
                hs: hs as i32,
                head_stride: attention.layout.head_stride as i32,
                part: attention.layout.part as i32,
                eps: eps as f32,
                scale: attention.scale as f32,
                ..StepDims::default()
            };
            let device = Device::Cuda(dev.clone());
            Ok(Some(Self {
                table: table(&layers, &device)?,
                _layers: layers,
                lnf,
                attention,
                sync: Tensor::zeros(2, DType::U32, &device)?,
                dims,
                dtype,
                dev,
                sms,
                smem_max,
            }))
        }

        /// Splits of a head's keys in the attention: as many as fill the grid, at least 16
        /// keys each.
        fn splits(&self, rows: usize, t_max: usize) -> usize {
            (self.sms / (rows * self.attention.nh)).clamp(1, t_max.div_ceil(16))
        }

        /// The dynamic shared memory's layout for `rows` and a cache of `t_max` (byte offsets
        /// into `dims`, and the attention's splits) and its size: two weight buffers (a
        /// block's columns of the widest projection), the stage's input rows, the split-K
        /// sums, the scores, p·v's partial sums, the query, the splits' merge weights, every
        /// layer's biases of the block's columns, the block's columns of the residual stream.
        fn layout(&self, rows: usize, t_max: usize) -> (StepDims, usize) {
            let (c, i, grid) = (self.dims.c as usize, self.dims.inner as usize, self.sms);
            let size = self.dtype.size_in_bytes();
            let per = |n: usize| n.div_ceil(grid);
            let wbuf = [(3 * c, c), (c, c), (i, c), (c, i)]
                .map(|(n, k)| per(n) * k * size)
                .into_iter()
                .max()
                .unwrap_or(0);
            let mut d = self.dims;
            d.wbuf = round_up(wbuf, 128) as i32;
            d.splits = self.splits(rows, t_max) as i32;
            let off_x = 2 * round_up(wbuf, 128);
            let off_part = off_x + round_up(rows * c.max(i) * size, 16);
            let off_p = off_part + 16.max(per(c.max(i).max(3 * c))) * rows * 4;
            let off_acc = off_p + round_up(t_max * 4, 16);
            let off_q = off_acc + THREADS * 4;
            let off_w = off_q + round_up(self.attention.hs * 4, 16);
            (d.off_x, d.off_part, d.off_p) = (off_x as i32, off_part as i32, off_p as i32);
            (d.off_acc, d.off_q, d.off_w) = (off_acc as i32, off_q as i32, off_w as i32);
            d.t_max = t_max as i32;
            let units = rows * self.attention.nh * d.splits as usize;
            // Every layer's biases of a block's columns, then its columns of the residual stream.
            let off_bias = round_up(off_w + 2 * units * 4, 16);
            let per_layer = per(3 * c) + 2 * per(c) + per(i);
            let off_res = round_up(off_bias + d.n_layer as usize * per_layer * size, 16);
            (d.off_bias, d.off_res) = (off_bias as i32, off_res as i32);
            (d, off_res + round_up(rows * per(c) * size, 16))
        }

        pub fn applies(&self, rows: usize, t_max: usize) -> bool {
            // 1 KiB left for the static shared memory (the mbarriers, the reductions: 144 B).
            let some = rows >= 1 && t_max >= 1;
            some && rows <= STEP_MAX_ROWS && self.layout(rows, t_max).1 + 1024 <= self.smem_max
        }

        pub fn forward(&self, x: &Tensor, slots: &[CacheSlot]) -> Result<Option<Tensor>> {
            let (rows, t, c) = x.dims3()?;
            let n_layer = self.dims.n_layer as usize;
            let Some(first) = slots.first() else {
                return Ok(None);
            };
            let t_max = first.k.dim(2)?;
            let (mut dims, shared) = self.layout(rows, t_max);
            let same = x.dtype() == self.dtype && c == self.dims.c as usize && t == 1;
            let aligned = crate::kernels::launch::aligned16(x);
            if !self.applies(rows, t_max) || !same || slots.len() != n_layer || !aligned {
                return Ok(None);
            }
            let mut caches = StepCaches {
                k: [0; MAX_LAYERS],
                v: [0; MAX_LAYERS],
            };
            let keys = [first.key_mask, first.key_pos];
            if keys
                .iter()
                .any(|t| t.dims() != [rows, t_max] || t.dtype() != DType::F32)
            {
                return Ok(None);
            }
            for (l, s) in slots.iter().enumerate() {
                let want = [rows, self.attention.nh, t_max, self.attention.hs];
                let cache = [s.k, s.v];
                let laid = cache.iter().all(|t| {
                    t.dims() == want
                        && t.dtype() == self.dtype
                        && crate::kernels::launch::aligned16(t)
                });
                if !laid {
                    return Ok(None);
                }
                (caches.k[l], caches.v[l]) = (device_address(s.k)?, device_address(s.v)?);
            }
            dims.pos = first.pos as i32;
            self.launch(x, first, caches, dims, shared).map(Some)
        }

        fn launch(
            &self,
            x: &Tensor,
            slot: &CacheSlot,
            caches: StepCaches,
            dims: StepDims,
            shared: usize,
        ) -> Result<Tensor> {
            let (rows, c, i) = (x.dim(0)?, dims.c as usize, dims.inner as usize);
            let dev = &self.dev;
            let func = match rows {
                1 => kernel!(dev, PTX, "tb_decode_step1", self.dtype)?,
                2 => kernel!(dev, PTX, "tb_decode_step2", self.dtype)?,
                3 => kernel!(dev, PTX, "tb_decode_step3", self.dtype)?,
                _ => kernel!(dev, PTX, "tb_decode_step4", self.dtype)?,
            };
            let max_shared =
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            func.set_attribute(max_shared, shared as i32).w()?;
            // The grid barrier needs every block resident at once: one an SM must fit.
            let resident =
                func.occupancy_max_active_blocks_per_multiprocessor(THREADS as u32, shared, None);
            if resident.w()? < 1 {
                bail!("the decode step kernel's block does not fit an SM ({shared} B of shared memory): leave step out of --fused");
            }
            let cfg = LaunchConfig {
                grid_dim: (self.sms as u32, 1, 1),
                block_dim: (THREADS as u32, 1, 1),
                shared_mem_bytes: shared as u32,
            };
            let table = device_address(&self.table)?;
            let (lnf_w, lnf_b) = (device_address(&self.lnf.0)?, device_address(&self.lnf.1)?);
            let x_in = device_address(x)?;
            let (mask, key_pos) = (
                device_address(slot.key_mask)?,
                device_address(slot.key_pos)?,
            );
            let slopes = self
                .attention
                .slopes
                .as_ref()
                .map_or(Ok(NULL), device_address)?;
            let cursor = slot.cursor.map_or(Ok(NULL), device_address)?;
            let sync = device_address(&self.sync)?;
            let units = rows * self.attention.nh * dims.splits as usize;
            let ml = alloc::<f32>(dev, units * 2)?;
            let pv = alloc::<f32>(dev, units * self.attention.hs)?;
            let trace = trace_buffer(self.sms, dims.n_layer as usize, x)?;
            let trace_at = trace
                .as_ref()
                .map_or(Ok(NULL), |(t, _)| device_address(t))?;
            let out = with_dtype!(self.dtype, T => {
                let qkv = alloc::<T>(dev, rows * 3 * c)?;
                let mlp = alloc::<T>(dev, rows * i)?;
                let resid = alloc::<T>(dev, rows * c)?;
                let out = alloc::<T>(dev, rows * c)?;
                // SAFETY: the table holds L rows of 12 weights whose shapes `fits` checked; the
                // caches (rows, nh, T_max, hs) each with pos < T_max (generate_in made room for
                // every step); mask and key positions (rows, T_max) f32; slopes nh f32; the
                // scratch rows·(3C, I, C, C) and the partials of rows·nh·splits units; the
                // trace (2 + 20·L)·grid u64 when not null; shared memory as `layout` laid it
                // out; the grid one block an SM with one block's shared memory, all resident.
                launch!(unsafe func, cfg; &table, &caches, &dims, &lnf_w, &lnf_b, &x_in, &qkv,
                    &ml, &pv, &mlp, &resid, &out, &mask, &key_pos, &slopes, &cursor, &sync,
                    &trace_at)?;
                wrap(out, dev, (rows, 1, c))
            });
            if let Some((t, path)) = trace {
                write_trace(&t, &path, self.sms, dims.n_layer as usize)?;
            }
            Ok(out)
        }
    }
}
