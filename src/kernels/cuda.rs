//! CUDA side of [`super`]: candle custom ops that launch the kernels of fused.cu on the
//! tensor's own stream, and the cuBLASLt epilogue matmul.

use super::{Act, AdamStep};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublaslt::{Activation, CudaBlasLT, Matmul, MatmulConfig};
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    bail, CpuStorage, CudaDevice, CudaStorage, CustomOp2, CustomOp3, DType, InplaceOp2, Layout,
    Result, Shape, Tensor,
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
        let func = dev.get_or_load_custom_func(
            &format!("tb_bias_act_fwd_{}", suffix(x.dtype())?),
            MODULE,
            PTX,
        )?;
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
        let func = dev.get_or_load_custom_func(
            &format!("tb_bias_act_bwd_{}", suffix(x.dtype())?),
            MODULE,
            PTX,
        )?;
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

/// softmax(scale·s + bias) (⊙ keep · keep_scale). Output (1 | 2, B, nh, Tq, Tk): the dropped
/// probabilities, then (with `with_probs` and dropout) the probabilities before dropout.
struct AttnSoftmax {
    scale: f32,
    keep_scale: f32,
    with_probs: bool,
}

impl AttnSoftmax {
    fn run(
        &self,
        s: (&CudaStorage, &Layout),
        bias: (&CudaStorage, &Layout),
        keep: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = s.0.device().clone();
        let (b, nh, tq, tk) = s.1.shape().dims4()?;
        let bh = bias.1.shape().dims4()?.1;
        let rows = b * nh * tq;
        let n = rows * tk;
        let two = self.with_probs && keep.is_some();
        let func = dev.get_or_load_custom_func(
            &format!("tb_attn_softmax_fwd_{}", suffix(s.0.dtype())?),
            MODULE,
            PTX,
        )?;
        with_dtype!(s.0.dtype(), T => {
            let sv = view::<T>(s.0, s.1)?;
            let bv = view::<f32>(bias.0, bias.1)?;
            let out = alloc::<T>(&dev, if two { 2 * n } else { n })?;
            let kv = keep.map(|(k, l)| view::<u8>(k, l)).transpose()?;
            let dims = [nh as i32, bh as i32, tq as i32, tk as i32];
            let mut launch = func.builder();
            launch.arg(&sv).arg(&bv);
            match &kv {
                Some(k) => launch.arg(k),
                None => launch.arg(&NULL),
            };
            let probs = out.slice(n..);
            launch.arg(&out);
            if two {
                launch.arg(&probs);
            } else {
                launch.arg(&NULL);
            }
            launch.arg(&self.scale).arg(&self.keep_scale);
            for d in &dims {
                launch.arg(d);
            }
            // SAFETY: s, keep and each output hold rows·Tk elements; bias (B, bh, Tq, Tk).
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
    keep: Option<(&Tensor, f32)>,
    with_probs: bool,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if !s.device().is_cuda() || !float_dtype(s) || !bias_fits(s, bias) {
        return Ok(None);
    }
    let s = s.contiguous()?;
    let op = AttnSoftmax {
        scale: scale as f32,
        keep_scale: keep.map_or(1., |(_, p)| 1. / (1. - p)),
        with_probs,
    };
    let out = match keep {
        Some((k, _)) => s.apply_op3_no_bwd(bias, &k.contiguous()?, &op)?,
        None => s.apply_op2_no_bwd(bias, &op)?,
    };
    let dropped = out.get(0)?;
    let probs = match (with_probs, keep) {
        (false, _) => None,
        (true, Some(_)) => Some(out.get(1)?),
        (true, None) => Some(dropped.clone()),
    };
    Ok(Some((dropped, probs)))
}

/// ds = scale · p ⊙ (dp − Σ p·dp), dp = dpd ⊙ keep · keep_scale.
struct AttnSoftmaxBwd {
    scale: f32,
    keep_scale: f32,
}

impl AttnSoftmaxBwd {
    fn run(
        &self,
        p: (&CudaStorage, &Layout),
        dpd: (&CudaStorage, &Layout),
        keep: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = p.0.device().clone();
        let dims = p.1.shape().dims();
        let tk = *dims.last().unwrap();
        let n = p.1.shape().elem_count();
        let rows = n / tk;
        let func = dev.get_or_load_custom_func(
            &format!("tb_attn_softmax_bwd_{}", suffix(p.0.dtype())?),
            MODULE,
            PTX,
        )?;
        with_dtype!(p.0.dtype(), T => {
            let (pv, gv) = (view::<T>(p.0, p.1)?, view::<T>(dpd.0, dpd.1)?);
            let kv = keep.map(|(k, l)| view::<u8>(k, l)).transpose()?;
            let out = alloc::<T>(&dev, n)?;
            let tk_i = tk as i32;
            let mut launch = func.builder();
            launch.arg(&pv).arg(&gv);
            match &kv {
                Some(k) => launch.arg(k),
                None => launch.arg(&NULL),
            };
            launch.arg(&out).arg(&self.scale).arg(&self.keep_scale).arg(&tk_i);
            // SAFETY: p, dpd, keep and out hold rows·Tk elements.
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
    keep: Option<(&Tensor, f32)>,
) -> Result<Option<Tensor>> {
    if !p.device().is_cuda() || !float_dtype(p) || dpd.dtype() != p.dtype() {
        return Ok(None);
    }
    let op = AttnSoftmaxBwd {
        scale: scale as f32,
        keep_scale: keep.map_or(1., |(_, q)| 1. / (1. - q)),
    };
    let (p, dpd) = (p.contiguous()?, dpd.contiguous()?);
    Ok(Some(match keep {
        Some((k, _)) => p.apply_op3_no_bwd(&dpd, &k.contiguous()?, &op)?,
        None => p.apply_op2_no_bwd(&dpd, &op)?,
    }))
}

// ---------------------------------------------------------------------------------------------
// AdamW.

/// mv' from mv (2, n) f32 and the gradient.
struct AdamMoments {
    beta1: f32,
    beta2: f32,
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
        let func = dev.get_or_load_custom_func(
            &format!("tb_adam_moments_{}", suffix(g.dtype())?),
            MODULE,
            PTX,
        )?;
        with_dtype!(g.dtype(), T => {
            let (mvv, gv) = (view::<f32>(mv, mvl)?, view::<T>(g, gl)?);
            let out = alloc::<f32>(&dev, 2 * n)?;
            let n_i = n as i64;
            let mut launch = func.builder();
            launch.arg(&mvv).arg(&gv).arg(&out).arg(&n_i).arg(&self.beta1).arg(&self.beta2);
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
        let func = dev.get_or_load_custom_func(
            &format!("tb_adamw_apply_{}", suffix(p.dtype())?),
            MODULE,
            PTX,
        )?;
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
