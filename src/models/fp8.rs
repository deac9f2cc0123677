//! fp8 weights (`--dtype fp8`, #37 item 3): a projection's or LM head's weight as E4M3 values
//! with one f32 scale per output row (per-channel, the scale taking the row's largest |w| to
//! E4M3's 448), activations and sums staying bf16 / f32. Quantized once after loading, with
//! candle's ops, so CPU and CUDA hold the same values; the decode GEMV ([`kernels::gemv_fp8`],
//! 1–4 rows) and the tensor-core kernel ([`kernels::skinny_fp8`], up to 16) read the bytes,
//! every other shape multiplies the weight turned back into the activations' dtype.
//! Shapes: W (N, K) = (out, in), nn.Linear's; x (M, K) -> (M, N).

use crate::kernels::{self, Act};
use candle_core::{DType, Result, Tensor};

/// E4M3's largest finite value.
pub const E4M3_MAX: f64 = 448.;

/// w (N, K) -> (q (N, K) E4M3, scale (N, 1) f32) with candle's ops (the CPU; candle's CUDA cast
/// to E4M3 is missing its kernel, so the GPU has its own, with the same IEEE divisions).
fn quantize_composed(w: &Tensor) -> Result<(Tensor, Tensor)> {
    let w = w.to_dtype(DType::F32)?; // (N, K)
    let amax = w.abs()?.max_keepdim(1)?; // (N, 1)
                                         // An all-zero row keeps a finite scale (its values stay zero).
    let max = Tensor::new(E4M3_MAX as f32, w.device())?;
    let scale = amax.clamp(1e-12f32, f32::MAX)?.broadcast_div(&max)?;
    let q = w.broadcast_div(&scale)?.clamp(-E4M3_MAX, E4M3_MAX)?;
    Ok((q.to_dtype(DType::F8E4M3)?, scale))
}

/// A weight (N, K) as E4M3 with its rows' scales, and the bias that goes with it.
pub struct Fp8Weight {
    q: Tensor,  // (N, K) F8E4M3
    sb: Tensor, // (N, 2) f32: each row's scale and bias (zero without one)
}

impl Fp8Weight {
    /// w (N, K) in any float dtype; bias (N,), or None for zeros.
    pub fn quantize(w: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        let n = w.dim(0)?;
        let (q, scale) = match kernels::quantize_fp8(&w.contiguous()?)? {
            Some(on_gpu) => on_gpu,
            None => quantize_composed(w)?,
        };
        let b = match bias {
            Some(b) => b.to_dtype(DType::F32)?.reshape((n, 1))?,
            None => Tensor::zeros((n, 1), DType::F32, scale.device())?,
        };
        let sb = Tensor::cat(&[&scale, &b], 1)?.contiguous()?; // (N, 2)
        Ok(Self { q, sb })
    }

    /// (N, K): out and in features.
    pub fn dims(&self) -> Result<(usize, usize)> {
        self.q.dims2()
    }

    /// The weight as (N, K) in `dtype`: scale · q.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        if let Some(w) = kernels::dequant_fp8(&self.q, &self.sb, dtype)? {
            return Ok(w);
        }
        let scale = self.sb.narrow(1, 0, 1)?; // (N, 1)
        self.q
            .to_dtype(DType::F32)?
            .broadcast_mul(&scale)?
            .to_dtype(dtype)
    }

    /// act(x Wᵀ + b), x (M, K), by the fp8 GEMV where it applies (1–4 rows of bf16 / f16 on
    /// CUDA), else by the tensor-core kernel (5–16 rows; 1–16 with the GEMV off); None
    /// elsewhere, where the caller multiplies [`Fp8Weight::dequantize`].
    pub fn gemv(&self, x: &Tensor, act: Act) -> Result<Option<Tensor>> {
        if let Some(y) = kernels::gemv_fp8(x, &self.q, &self.sb, act)? {
            return Ok(Some(y));
        }
        kernels::skinny_fp8(x, &self.q, &self.sb, act)
    }

    /// Bytes the weight holds (values and the (scale, bias) pairs).
    pub fn bytes(&self) -> Result<usize> {
        Ok(self.q.elem_count() + self.sb.elem_count() * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// E4M3 keeps 3 mantissa bits: every value within half a step of its binade (2⁻⁴ of it)
    /// after the row's scale, and subnormals (below 2⁻⁶ · scale) within half their step, 2⁻¹⁰.
    #[test]
    fn values_come_back_within_e4m3s_rounding_of_their_rows_scale() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1., (6, 64), &dev).unwrap();
        let w = w
            .broadcast_mul(
                &Tensor::new(&[[1e-3f32], [0.1], [1.], [10.], [300.], [0.]], &dev).unwrap(),
            )
            .unwrap();
        let fp8 = Fp8Weight::quantize(&w, None).unwrap();
        let back: Vec<Vec<f32>> = fp8.dequantize(DType::F32).unwrap().to_vec2().unwrap();
        let rows: Vec<Vec<f32>> = w.to_vec2().unwrap();
        for (r, (got, want)) in back.iter().zip(&rows).enumerate() {
            let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax.max(1e-12) / 448.;
            for (g, v) in got.iter().zip(want) {
                let tol = v.abs() * 2f32.powi(-4) + scale * 2f32.powi(-10) + 1e-12;
                assert!((g - v).abs() <= tol * 1.0001, "row {r}: {v} came back {g}");
            }
            // The row's largest |w| is E4M3's 448 times the scale: exact.
            let at = want.iter().position(|v| v.abs() == amax).unwrap();
            assert!((got[at] - want[at]).abs() <= amax * 1e-6, "row {r}'s max");
        }
        assert!(back[5].iter().all(|v| *v == 0.), "a zero row stays zero");
        assert_eq!(fp8.bytes().unwrap(), 6 * 64 + 6 * 2 * 4);
    }

    /// Values on E4M3's grid: 3.3 rounds to 3.25 (a step of 0.25 in [2, 4)), 0.3 to 0.3125
    /// (0.03125 in [0.25, 0.5)); the scale is 1 where the row's max is 448.
    #[test]
    fn a_row_scaled_to_448_rounds_to_the_e4m3_grid() {
        let w = Tensor::new(
            &[[448f32, 3.3, -3.3, 0.3, 1.0, -0.5, 0., 100.]],
            &Device::Cpu,
        )
        .unwrap();
        let fp8 = Fp8Weight::quantize(&w, None).unwrap();
        let back: Vec<Vec<f32>> = fp8.dequantize(DType::F32).unwrap().to_vec2().unwrap();
        assert_eq!(back[0], [448., 3.25, -3.25, 0.3125, 1.0, -0.5, 0., 96.]);
    }
}
