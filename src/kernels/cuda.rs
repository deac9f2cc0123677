//! CUDA side of [`super`]: candle custom ops that launch the kernels of fused.cu on the
//! tensor's own stream, and the cuBLASLt epilogue matmul.

use super::{Act, AdamStep, Keep};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublaslt::{Activation, CudaBlasLT, Matmul, MatmulConfig};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    bail, CpuStorage, CudaDevice, CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device,
    InplaceOp2, Layout, Result, Shape, Tensor,
};
use half::{bf16, f16};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fused.ptx"));
const MODULE: &str = "tb_fused";

fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        d => bail!("fused kernels take f32, bf16 or f16, not {d:?}"),
    })
}

/// The fused.cu kernel `$name` + `_f32|_bf16|_f16` for `$dtype` on device `$dev`, loaded once
/// per device.
macro_rules! kernel {
    ($dev:expr, $name:literal, $dtype:expr) => {
        $dev.get_or_load_custom_func(
            &format!(concat!($name, "_{}"), suffix($dtype)?),
            MODULE,
            PTX,
        )
    };
}

fn float_dtype(t: &Tensor) -> bool {
    matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
}

/// Runs `$body` with `$t` bound to the Rust element type of `$dtype`.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::BF16 => {
                type $t = bf16;
                $body
            }
            DType::F16 => {
                type $t = f16;
                $body
            }
            d => bail!("fused kernels take f32, bf16 or f16, not {d:?}"),
        }
    };
}

/// The view of a contiguous storage from its layout's offset.
fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    if !l.is_contiguous() {
        bail!("fused kernel input is not contiguous");
    }
    Ok(T::as_cuda_slice(s)?.slice(l.start_offset()..))
}

fn cpu_only<T>(name: &str) -> Result<T> {
    bail!("{name} is a CUDA kernel; the CPU runs candle's composed ops")
}

/// The `cpu_fwd` every custom op here must have: an error (callers never reach it on CPU).
macro_rules! no_cpu_fwd {
    (CustomOp1) => {
        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            cpu_only(CustomOp1::name(self))
        }
    };
    (CustomOp2) => {
        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            cpu_only(CustomOp2::name(self))
        }
    };
    (CustomOp3) => {
        fn cpu_fwd(
            &self,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            cpu_only(CustomOp3::name(self))
        }
    };
}

/// One block per row, enough threads to cover `cols` (at most 256: the rest loop).
fn row_config(rows: usize, cols: usize) -> LaunchConfig {
    let threads = cols.next_power_of_two().clamp(32, 256) as u32;
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// 256 columns per block along x, rows along y (grid-strided past 65535).
fn column_config(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(256) as u32, rows.clamp(1, 65535) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Grid-stride elementwise launch over `n` elements.
fn flat_config(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 132 * 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn alloc<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written by the kernel that follows.
    unsafe { dev.alloc::<T>(n) }
}

/// A null device pointer for an absent optional argument.
const NULL: u64 = 0;

// ---------------------------------------------------------------------------------------------
// cuBLASLt: one handle (and its 32 MiB workspace) per candle device, on the device's stream.

fn lt_handle(dev: &CudaDevice) -> Result<Arc<CudaBlasLT>> {
    static HANDLES: OnceLock<Mutex<HashMap<String, Arc<CudaBlasLT>>>> = OnceLock::new();
    let mut map = HANDLES.get_or_init(Default::default).lock().unwrap();
    let key = format!("{:?}", dev.id());
    if let Some(h) = map.get(&key) {
        return Ok(h.clone());
    }
    let h = Arc::new(
        CudaBlasLT::new(dev.cuda_stream())
            .map_err(|e| candle_core::Error::Msg(format!("cuBLASLt handle: {e:?}")))?,
    );
    map.insert(key, h.clone());
    Ok(h)
}

struct LtLinear {
    w_out_in: bool,
    act: Act,
}

impl LtLinear {
    fn run<T: CudaDType + DeviceRepr>(
        &self,
        x: (&CudaStorage, &Layout),
        w: (&CudaStorage, &Layout),
        b: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)>
    where
        CudaBlasLT: Matmul<T>,
    {
        let dev = x.0.device().clone();
        let (n_rows, k) = x.1.shape().dims2()?;
        let (w0, w1) = w.1.shape().dims2()?;
        let n_out = if self.w_out_in { w0 } else { w1 };
        let mut out = alloc::<T>(&dev, n_rows * n_out)?;
        // Row-major Y (N, out) is column-major Yᵀ (out × N) = Wᵀ-or-W (out × in) · Xᵀ (in × N).
        let cfg = MatmulConfig {
            transa: self.w_out_in,
            transb: false,
            transc: false,
            m: n_out as u64,
            n: n_rows as u64,
            k: k as u64,
            alpha: 1.,
            lda: if self.w_out_in { k } else { n_out } as i64,
            ldb: k as i64,
            beta: 0.,
            ldc: n_out as i64,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_bias: None,
            batch_size: None,
        };
        let act = match self.act {
            Act::GeluTanh => Some(Activation::Gelu),
            _ => None,
        };
        let _ = (w0, w1);
        let lt = lt_handle(&dev)?;
        let (xv, wv, bv) = (
            view::<T>(x.0, x.1)?,
            view::<T>(w.0, w.1)?,
            view::<T>(b.0, b.1)?,
        );
        // SAFETY: shapes checked above; every buffer is on this device's stream.
        unsafe { lt.matmul(cfg, &wv, &xv, &mut out, Some(&bv), act.as_ref()) }
            .map_err(|e| candle_core::Error::Msg(format!("cuBLASLt matmul: {e:?}")))?;
        Ok((T::wrap_cuda_slice(out, dev), Shape::from((n_rows, n_out))))
    }
}

impl CustomOp3 for LtLinear {
    fn name(&self) -> &'static str {
        "tb-lt-linear"
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
        match x.dtype() {
            DType::BF16 => self.run::<bf16>((x, xl), (w, wl), (b, bl)),
            DType::F16 => self.run::<f16>((x, xl), (w, wl), (b, bl)),
            d => bail!("cuBLASLt linear takes bf16 or f16, not {d:?}"),
        }
    }
}

pub fn linear(
    x: &Tensor,
    w: &Tensor,
    w_out_in: bool,
    b: &Tensor,
    act: Act,
) -> Result<Option<Tensor>> {
    let half = matches!(x.dtype(), DType::BF16 | DType::F16);
    let exact_act = matches!(act, Act::None | Act::GeluTanh);
    if !x.device().is_cuda() || !half || !exact_act || x.rank() != 2 {
        return Ok(None);
    }
    if !(x.is_contiguous() && w.is_contiguous() && b.is_contiguous()) {
        return Ok(None);
    }
    Ok(Some(x.apply_op3_no_bwd(
        w,
        b,
        &LtLinear { w_out_in, act },
    )?))
}

// ---------------------------------------------------------------------------------------------
// Bias + activation.

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
        let func = kernel!(dev, "tb_bias_act_fwd", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, bv) = (view::<T>(x, xl)?, view::<T>(b, bl)?);
            let out = alloc::<T>(&dev, rows * n)?;
            let (rows_i, n_i, act) = (rows as i64, n as i32, self.0.code());
            let mut launch = func.builder();
            launch.arg(&xv).arg(&bv).arg(&out).arg(&rows_i).arg(&n_i).arg(&act);
            // SAFETY: x and out hold rows·n elements, b holds n.
            unsafe { launch.launch(column_config(rows, n)) }.w()?;
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
        let dx = match self.0 {
            Act::None => dy.clone(),
            act => x.apply_op3_no_bwd(b, &dy.contiguous()?, &BiasActGrad(act))?,
        };
        let db = dx.sum(0)?;
        Ok((Some(dx), Some(db)))
    }
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
        let func = kernel!(dev, "tb_bias_act_bwd", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, bv, dyv) = (view::<T>(x, xl)?, view::<T>(b, bl)?, view::<T>(dy, dyl)?);
            let out = alloc::<T>(&dev, rows * n)?;
            let (rows_i, n_i, act) = (rows as i64, n as i32, self.0.code());
            let mut launch = func.builder();
            launch.arg(&xv).arg(&bv).arg(&dyv).arg(&out).arg(&rows_i).arg(&n_i).arg(&act);
            // SAFETY: x, dy and out hold rows·n elements, b holds n.
            unsafe { launch.launch(column_config(rows, n)) }.w()?;
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

// ---------------------------------------------------------------------------------------------
// Attention softmax, forward and backward.

/// The dropout arguments every kernel with a `Keep` takes: the u8 mask (or null), the hash
/// key and threshold (0: no hashed mask), and 1/(1 − p).
#[derive(Clone, Copy, Default)]
struct KeepArgs {
    key: u64,
    thresh: u32,
    scale: f32,
    /// Dropout applies (a mask tensor comes as the op's last input, or the hash).
    active: bool,
}

impl KeepArgs {
    fn new(keep: Option<(&Keep, f32)>) -> Self {
        match keep {
            None => Self {
                scale: 1.,
                ..Self::default()
            },
            Some((k, p)) => Self {
                key: match k {
                    Keep::Hash(key) => *key,
                    Keep::Mask(_) => 0,
                },
                thresh: match k {
                    Keep::Hash(_) => threshold(p),
                    Keep::Mask(_) => 0,
                },
                scale: 1. / (1. - p),
                active: true,
            },
        }
    }
}

/// Drop when the hash's upper 32 bits are below p·2³² (at least 1 for p > 0).
fn threshold(p: f32) -> u32 {
    ((p as f64 * 4294967296.).round() as u64).clamp(1, u32::MAX as u64) as u32
}

/// softmax(scale·s + bias) (⊙ keep / (1 − p)). Output (1 | 2, B, nh, Tq, Tk): the dropped
/// probabilities, then (with `with_probs` and dropout) the probabilities before dropout.
struct AttnSoftmax {
    scale: f32,
    keep: KeepArgs,
    with_probs: bool,
}

impl AttnSoftmax {
    fn run(
        &self,
        s: (&CudaStorage, &Layout),
        bias: (&CudaStorage, &Layout),
        mask: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = s.0.device().clone();
        let (b, nh, tq, tk) = s.1.shape().dims4()?;
        let bh = bias.1.shape().dims4()?.1;
        let rows = b * nh * tq;
        let n = rows * tk;
        let two = self.with_probs && self.keep.active;
        let func = kernel!(dev, "tb_attn_softmax_fwd", s.0.dtype())?;
        with_dtype!(s.0.dtype(), T => {
            let sv = view::<T>(s.0, s.1)?;
            let bv = view::<f32>(bias.0, bias.1)?;
            let out = alloc::<T>(&dev, if two { 2 * n } else { n })?;
            let mv = mask.map(|(k, l)| view::<u8>(k, l)).transpose()?;
            let dims = [nh as i32, bh as i32, tq as i32, tk as i32];
            let mut launch = func.builder();
            launch.arg(&sv).arg(&bv);
            match &mv {
                Some(m) => launch.arg(m),
                None => launch.arg(&NULL),
            };
            launch.arg(&self.keep.key).arg(&self.keep.thresh);
            let probs = out.slice(n..);
            launch.arg(&out);
            if two {
                launch.arg(&probs);
            } else {
                launch.arg(&NULL);
            }
            launch.arg(&self.scale).arg(&self.keep.scale);
            for d in &dims {
                launch.arg(d);
            }
            // SAFETY: s, the mask and each output hold rows·Tk elements; bias (B, bh, Tq, Tk).
            unsafe { launch.launch(row_config(rows, tk)) }.w()?;
            let shape: Vec<usize> = [if two { 2 } else { 1 }, b, nh, tq, tk].to_vec();
            Ok((T::wrap_cuda_slice(out, dev), Shape::from(shape)))
        })
    }
}

impl CustomOp2 for AttnSoftmax {
    fn name(&self) -> &'static str {
        "tb-attn-softmax"
    }
    no_cpu_fwd!(CustomOp2);
    fn cuda_fwd(
        &self,
        s: &CudaStorage,
        sl: &Layout,
        bias: &CudaStorage,
        bl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run((s, sl), (bias, bl), None)
    }
}

impl CustomOp3 for AttnSoftmax {
    fn name(&self) -> &'static str {
        "tb-attn-softmax-dropout"
    }
    no_cpu_fwd!(CustomOp3);
    fn cuda_fwd(
        &self,
        s: &CudaStorage,
        sl: &Layout,
        bias: &CudaStorage,
        bl: &Layout,
        keep: &CudaStorage,
        kl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run((s, sl), (bias, bl), Some((keep, kl)))
    }
}

/// Bias layouts the kernel reads directly: f32, contiguous, (B, 1 | nh, Tq, Tk).
fn bias_fits(s: &Tensor, bias: &Tensor) -> bool {
    let (Ok((b, nh, tq, tk)), Ok((bb, bh, bq, bk))) = (s.dims4(), bias.dims4()) else {
        return false;
    };
    bias.dtype() == DType::F32
        && bias.is_contiguous()
        && (bb, bq, bk) == (b, tq, tk)
        && (bh == 1 || bh == nh)
}

pub fn attn_softmax(
    s: &Tensor,
    bias: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
    with_probs: bool,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if !s.device().is_cuda() || !float_dtype(s) || !bias_fits(s, bias) {
        return Ok(None);
    }
    let s = s.contiguous()?;
    let op = AttnSoftmax {
        scale: scale as f32,
        keep: KeepArgs::new(keep),
        with_probs,
    };
    let out = match keep {
        Some((Keep::Mask(m), _)) => s.apply_op3_no_bwd(bias, &m.contiguous()?, &op)?,
        _ => s.apply_op2_no_bwd(bias, &op)?,
    };
    let dropped = out.get(0)?;
    let probs = match (with_probs, keep) {
        (false, _) => None,
        (true, Some(_)) => Some(out.get(1)?),
        (true, None) => Some(dropped.clone()),
    };
    Ok(Some((dropped, probs)))
}

/// ds = scale · p ⊙ (dp − Σ p·dp), dp = dpd ⊙ keep / (1 − p_drop).
struct AttnSoftmaxBwd {
    scale: f32,
    keep: KeepArgs,
}

impl AttnSoftmaxBwd {
    fn run(
        &self,
        p: (&CudaStorage, &Layout),
        dpd: (&CudaStorage, &Layout),
        mask: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = p.0.device().clone();
        let dims = p.1.shape().dims();
        let tk = *dims.last().unwrap();
        let n = p.1.shape().elem_count();
        let rows = n / tk;
        let func = kernel!(dev, "tb_attn_softmax_bwd", p.0.dtype())?;
        with_dtype!(p.0.dtype(), T => {
            let (pv, gv) = (view::<T>(p.0, p.1)?, view::<T>(dpd.0, dpd.1)?);
            let mv = mask.map(|(k, l)| view::<u8>(k, l)).transpose()?;
            let out = alloc::<T>(&dev, n)?;
            let tk_i = tk as i32;
            let mut launch = func.builder();
            launch.arg(&pv).arg(&gv);
            match &mv {
                Some(m) => launch.arg(m),
                None => launch.arg(&NULL),
            };
            launch.arg(&self.keep.key).arg(&self.keep.thresh);
            launch.arg(&out).arg(&self.scale).arg(&self.keep.scale).arg(&tk_i);
            // SAFETY: p, dpd, the mask and out hold rows·Tk elements.
            unsafe { launch.launch(row_config(rows, tk)) }.w()?;
            Ok((T::wrap_cuda_slice(out, dev), p.1.shape().clone()))
        })
    }
}

impl CustomOp2 for AttnSoftmaxBwd {
    fn name(&self) -> &'static str {
        "tb-attn-softmax-bwd"
    }
    no_cpu_fwd!(CustomOp2);
    fn cuda_fwd(
        &self,
        p: &CudaStorage,
        pl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run((p, pl), (g, gl), None)
    }
}

impl CustomOp3 for AttnSoftmaxBwd {
    fn name(&self) -> &'static str {
        "tb-attn-softmax-bwd-dropout"
    }
    no_cpu_fwd!(CustomOp3);
    fn cuda_fwd(
        &self,
        p: &CudaStorage,
        pl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
        k: &CudaStorage,
        kl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.run((p, pl), (g, gl), Some((k, kl)))
    }
}

pub fn attn_softmax_bwd(
    p: &Tensor,
    dpd: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
) -> Result<Option<Tensor>> {
    if !p.device().is_cuda() || !float_dtype(p) || dpd.dtype() != p.dtype() {
        return Ok(None);
    }
    let op = AttnSoftmaxBwd {
        scale: scale as f32,
        keep: KeepArgs::new(keep),
    };
    let (p, dpd) = (p.contiguous()?, dpd.contiguous()?);
    Ok(Some(match keep {
        Some((Keep::Mask(m), _)) => p.apply_op3_no_bwd(&dpd, &m.contiguous()?, &op)?,
        _ => p.apply_op2_no_bwd(&dpd, &op)?,
    }))
}

// ---------------------------------------------------------------------------------------------
// Dropout with the hashed mask.

/// y = x ⊙ keep(key) / (1 − p); the backward is the same op on the gradient.
#[derive(Clone, Copy)]
struct HashDropout {
    key: u64,
    thresh: u32,
    scale: f32,
}

impl CustomOp1 for HashDropout {
    fn name(&self) -> &'static str {
        "tb-dropout"
    }
    no_cpu_fwd!(CustomOp1);
    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = x.device().clone();
        let n = xl.shape().elem_count();
        let func = kernel!(dev, "tb_dropout", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let xv = view::<T>(x, xl)?;
            let out = alloc::<T>(&dev, n)?;
            let n_i = n as i64;
            let mut launch = func.builder();
            launch.arg(&xv).arg(&out).arg(&n_i).arg(&self.key).arg(&self.thresh).arg(&self.scale);
            // SAFETY: x and out hold n elements.
            unsafe { launch.launch(flat_config(n)) }.w()?;
            Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
        })
    }
    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.contiguous()?.apply_op1_no_bwd(self)?))
    }
}

pub fn dropout(x: &Tensor, key: u64, p: f32) -> Result<Option<Tensor>> {
    if !float_dtype(x) {
        return Ok(None);
    }
    let op = HashDropout {
        key,
        thresh: threshold(p),
        scale: 1. / (1. - p),
    };
    Ok(Some(x.contiguous()?.apply_op1(op)?))
}

pub fn hash_mask(key: u64, p: f32, shape: &Shape, dev: &Device) -> Result<Tensor> {
    let Device::Cuda(cuda) = dev else {
        bail!("hashed dropout masks are drawn on CUDA only");
    };
    let n = shape.elem_count();
    let func = cuda.get_or_load_custom_func("tb_dropout_mask", MODULE, PTX)?;
    let out = alloc::<u8>(cuda, n)?;
    let (n_i, thresh) = (n as i64, threshold(p));
    let mut launch = func.builder();
    launch.arg(&out).arg(&n_i).arg(&key).arg(&thresh);
    // SAFETY: out holds n elements.
    unsafe { launch.launch(flat_config(n)) }.w()?;
    let storage = candle_core::Storage::Cuda(CudaStorage::wrap_cuda_slice(out, cuda.clone()));
    Ok(Tensor::from_storage(
        storage,
        shape.clone(),
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

// ---------------------------------------------------------------------------------------------
// LayerNorm: forward, and its backward as two kernels (dx; partial sums of dw and db).

/// Rows per block of the dw/db partial sums (LN_ROWS in fused.cu).
const LN_ROWS: usize = 64;

/// One warp per row, 8 rows per block.
fn warp_rows_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

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
        let func = kernel!(dev, "tb_layer_norm_fwd", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, wv, bv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(b, bl)?);
            let out = alloc::<T>(&dev, rows * c)?;
            let (rows_i, c_i) = (rows as i64, c as i32);
            let mut launch = func.builder();
            launch.arg(&xv).arg(&wv).arg(&bv).arg(&out).arg(&rows_i).arg(&c_i).arg(&self.eps);
            // SAFETY: x and out hold rows·C elements, w and b C.
            unsafe { launch.launch(warp_rows_config(rows)) }.w()?;
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
        let dy = dy.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &dy, &LayerNormGradX { eps: self.eps })?;
        let part = x.apply_op2_no_bwd(&dy, &LayerNormGradWb { eps: self.eps })?; // (blocks, 2, C)
        let wb = part.sum(0)?.to_dtype(w.dtype())?; // (2, C)
        Ok((Some(dx), Some(wb.get(0)?), Some(wb.get(1)?)))
    }
}

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
        let func = kernel!(dev, "tb_layer_norm_bwd_x", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, wv, dyv) = (view::<T>(x, xl)?, view::<T>(w, wl)?, view::<T>(dy, dyl)?);
            let out = alloc::<T>(&dev, rows * c)?;
            let (rows_i, c_i) = (rows as i64, c as i32);
            let mut launch = func.builder();
            launch.arg(&xv).arg(&wv).arg(&dyv).arg(&out).arg(&rows_i).arg(&c_i).arg(&self.eps);
            // SAFETY: x, dy and out hold rows·C elements, w C.
            unsafe { launch.launch(warp_rows_config(rows)) }.w()?;
            Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
        })
    }
}

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
        let func = kernel!(dev, "tb_layer_norm_bwd_wb", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, dyv) = (view::<T>(x, xl)?, view::<T>(dy, dyl)?);
            let part = alloc::<f32>(&dev, blocks * 2 * c)?;
            let (rows_i, c_i) = (rows as i64, c as i32);
            let mut launch = func.builder();
            launch.arg(&xv).arg(&dyv).arg(&part).arg(&rows_i).arg(&c_i).arg(&self.eps);
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: x and dy hold rows·C elements, part blocks·2·C.
            unsafe { launch.launch(cfg) }.w()?;
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

// ---------------------------------------------------------------------------------------------
// Cross-entropy over the logits.

/// Per-row loss (N,) f32 of logits (N, ld) and targets (N,) u32 over the first `vocab` columns.
#[derive(Clone, Copy)]
struct CrossEntropy {
    vocab: usize,
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "tb-cross-entropy"
    }
    no_cpu_fwd!(CustomOp2);
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        t: &CudaStorage,
        tl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device().clone();
        let (rows, ld) = xl.shape().dims2()?;
        let func = kernel!(dev, "tb_xent_fwd", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, tv) = (view::<T>(x, xl)?, view::<u32>(t, tl)?);
            let out = alloc::<f32>(&dev, rows)?;
            let (v_i, ld_i) = (self.vocab as i32, ld as i32);
            let mut launch = func.builder();
            launch.arg(&xv).arg(&tv).arg(&out).arg(&v_i).arg(&ld_i);
            // SAFETY: x holds rows·V elements, targets and out rows.
            unsafe { launch.launch(row_config(rows, ld)) }.w()?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(rows)))
        })
    }
    fn bwd(
        &self,
        x: &Tensor,
        t: &Tensor,
        _loss: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad.to_dtype(DType::F32)?.contiguous()?;
        let op = CrossEntropyGrad { vocab: self.vocab };
        Ok((Some(x.apply_op3_no_bwd(t, &g, &op)?), None))
    }
}

/// dx = g · (softmax(x) − onehot(target)) over the vocabulary, 0 in padded columns.
struct CrossEntropyGrad {
    vocab: usize,
}

impl CustomOp3 for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "tb-cross-entropy-grad"
    }
    no_cpu_fwd!(CustomOp3);
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        t: &CudaStorage,
        tl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device().clone();
        let (rows, ld) = xl.shape().dims2()?;
        let func = kernel!(dev, "tb_xent_bwd", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let (xv, tv, gv) = (view::<T>(x, xl)?, view::<u32>(t, tl)?, view::<f32>(g, gl)?);
            let out = alloc::<T>(&dev, rows * ld)?;
            let (v_i, ld_i) = (self.vocab as i32, ld as i32);
            let mut launch = func.builder();
            launch.arg(&xv).arg(&tv).arg(&gv).arg(&out).arg(&v_i).arg(&ld_i);
            // SAFETY: x and out hold rows·ld elements, targets and g rows.
            unsafe { launch.launch(row_config(rows, ld)) }.w()?;
            Ok((T::wrap_cuda_slice(out, dev), xl.shape().clone()))
        })
    }
}

pub fn cross_entropy(logits: &Tensor, targets: &Tensor, vocab: usize) -> Result<Option<Tensor>> {
    let ok_targets = targets.dtype() == DType::U32 && targets.rank() == 1;
    if !logits.device().is_cuda() || !float_dtype(logits) || logits.rank() != 2 || !ok_targets {
        return Ok(None);
    }
    if vocab == 0 || vocab > logits.dim(1)? {
        bail!(
            "cross-entropy: vocabulary {vocab} for logits {:?}",
            logits.shape()
        );
    }
    let (x, t) = (logits.contiguous()?, targets.contiguous()?);
    Ok(Some(x.apply_op2(&t, CrossEntropy { vocab })?))
}

// ---------------------------------------------------------------------------------------------
// AdamW.

/// mv' from mv (2, n) f32 and the gradient (times grad_scale).
struct AdamMoments {
    beta1: f32,
    beta2: f32,
    grad_scale: f32,
}

impl CustomOp2 for AdamMoments {
    fn name(&self) -> &'static str {
        "tb-adam-moments"
    }
    no_cpu_fwd!(CustomOp2);
    fn cuda_fwd(
        &self,
        mv: &CudaStorage,
        mvl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = mv.device().clone();
        let n = gl.shape().elem_count();
        let func = kernel!(dev, "tb_adam_moments", g.dtype())?;
        with_dtype!(g.dtype(), T => {
            let (mvv, gv) = (view::<f32>(mv, mvl)?, view::<T>(g, gl)?);
            let out = alloc::<f32>(&dev, 2 * n)?;
            let n_i = n as i64;
            let mut launch = func.builder();
            launch.arg(&mvv).arg(&gv).arg(&out).arg(&n_i).arg(&self.beta1).arg(&self.beta2);
            launch.arg(&self.grad_scale);
            // SAFETY: mv and out hold 2n elements, g holds n.
            unsafe { launch.launch(flat_config(n)) }.w()?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), mvl.shape().clone()))
        })
    }
}

/// p ← p·decay − step_size · m / (√v / bc2_sqrt + ε), in place.
struct AdamApply {
    decay: f32,
    step_size: f32,
    bc2_sqrt: f32,
    eps: f32,
}

impl InplaceOp2 for AdamApply {
    fn name(&self) -> &'static str {
        "tb-adamw-apply"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        cpu_only(self.name())
    }
    fn cuda_fwd(
        &self,
        p: &mut CudaStorage,
        pl: &Layout,
        mv: &CudaStorage,
        mvl: &Layout,
    ) -> Result<()> {
        let dev = p.device().clone();
        let n = pl.shape().elem_count();
        let func = kernel!(dev, "tb_adamw_apply", p.dtype())?;
        let mvv = view::<f32>(mv, mvl)?;
        if !pl.is_contiguous() {
            bail!("fused AdamW: parameter is not contiguous");
        }
        with_dtype!(p.dtype(), T => {
            let off = pl.start_offset();
            let mut pv = T::as_cuda_slice_mut(p)?.slice_mut(off..off + n);
            let n_i = n as i64;
            let mut launch = func.builder();
            launch.arg(&mut pv).arg(&mvv).arg(&n_i).arg(&self.decay).arg(&self.step_size);
            launch.arg(&self.bc2_sqrt).arg(&self.eps);
            // SAFETY: p holds n elements from its offset, mv 2n.
            unsafe { launch.launch(flat_config(n)) }.w()?;
            Ok(())
        })
    }
}

/// Σ x² of a whole tensor, (1,) f32.
struct SumSquares;

impl CustomOp1 for SumSquares {
    fn name(&self) -> &'static str {
        "tb-sum-squares"
    }
    no_cpu_fwd!(CustomOp1);
    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = x.device().clone();
        let n = xl.shape().elem_count();
        let func = kernel!(dev, "tb_sum_squares", x.dtype())?;
        with_dtype!(x.dtype(), T => {
            let xv = view::<T>(x, xl)?;
            let out = dev.alloc_zeros::<f32>(1)?;
            let n_i = n as i64;
            let mut launch = func.builder();
            launch.arg(&xv).arg(&out).arg(&n_i);
            // SAFETY: x holds n elements, out one.
            unsafe { launch.launch(flat_config(n)) }.w()?;
            Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(1)))
        })
    }
}

pub fn sum_squares(x: &Tensor) -> Result<Option<Tensor>> {
    if !x.device().is_cuda() || !float_dtype(x) {
        return Ok(None);
    }
    Ok(Some(x.contiguous()?.apply_op1_no_bwd(&SumSquares)?))
}

pub fn adamw(param: &Tensor, grad: &Tensor, mv: &Tensor, h: &AdamStep) -> Result<Option<Tensor>> {
    if !param.device().is_cuda() || !float_dtype(param) || grad.dtype() != param.dtype() {
        return Ok(None);
    }
    if !(param.is_contiguous() && mv.is_contiguous()) || mv.dtype() != DType::F32 {
        return Ok(None);
    }
    let g = grad.contiguous()?.flatten_all()?;
    let moments = AdamMoments {
        beta1: h.beta1 as f32,
        beta2: h.beta2 as f32,
        grad_scale: h.grad_scale as f32,
    };
    let mv = mv.apply_op2_no_bwd(&g, &moments)?;
    let apply = AdamApply {
        decay: (1. - h.lr * h.weight_decay) as f32,
        step_size: (h.lr / h.bc1) as f32,
        bc2_sqrt: h.bc2_sqrt as f32,
        eps: h.eps as f32,
    };
    param.inplace_op2(&mv, &apply)?;
    Ok(Some(mv))
}
