//! Inference projections as one cuBLASLt matmul with the bias (and tanh-GELU) in its epilogue
//! (`--fused lt`): no kernel of ours, cudarc's cuBLASLt binding.
//!
//! Shapes: N rows, `in` and `out` features. x (N, in); W (out, in) (`w_out_in`, nn.Linear) or
//! (in, out) (GPT-2's Conv1D); b (out,); y (N, out). All bf16 or f16.

use super::{enabled, Act, Fused};
use candle_core::{Result, Tensor};

/// act(x Wᵀ + b) (`w_out_in`: W is (out, in), nn.Linear) or act(x W + b) (W (in, out), GPT-2's
/// Conv1D) as one cuBLASLt call, bias and activation in the epilogue. x: (N, in) -> (N, out).
/// Inference only (no backward): `None` when x or W is tracked by autograd, and for fp32
/// (cudarc's cuBLASLt computes fp32 as TF32), for ReLU and erf-GELU (no exact epilogue).
/// A decode step's 1–4 rows of nn.Linear weights go to the GEMV first (`--fused gemv`, its own
/// switch), 5–16 rows to the tensor-core kernel (`--fused skinny-proj`).
pub fn linear(
    x: &Tensor,
    w: &Tensor,
    w_out_in: bool,
    b: &Tensor,
    act: Act,
) -> Result<Option<Tensor>> {
    if x.track_op() || w.track_op() || b.track_op() {
        return Ok(None);
    }
    if w_out_in {
        if let Some(y) = super::gemv(x, w, b, act)? {
            return Ok(Some(y));
        }
        if let Some(y) = super::skinny_linear(x, w, b, act)? {
            return Ok(Some(y));
        }
    }
    if !enabled(Fused::Lt) {
        return Ok(None);
    }
    imp::linear(x, w, w_out_in, b, act)
}

/// The CPU has no cuBLASLt: candle's matmul and bias add.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Act;
    use candle_core::{Result, Tensor};

    pub fn linear(_: &Tensor, _: &Tensor, _: bool, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Act;
    use crate::kernels::launch::{alloc, no_cpu_fwd, view};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::cublaslt::{
        Activation, CudaBlasLT, Matmul, MatmulConfig,
    };
    use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{
        bail, CudaDevice, CudaStorage, CustomOp3, DType, Layout, Result, Shape, Tensor,
    };
    use half::{bf16, f16};
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    /// One cuBLASLt handle (and its 32 MiB workspace) per candle device, on the device's stream.
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
            // Row-major Y (N, out) is column-major Yᵀ (out × N)
            //   = Wᵀ-or-W (out × in) · Xᵀ (in × N).
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
}
