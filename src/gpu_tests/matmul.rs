//! The projections: cuBLASLt with the bias and GELU in its epilogue, the decode GEMV, the
//! tensor-core LM head at a few rows.

use super::*;

#[test]
fn lt_linear_matches_matmul_plus_bias_and_gelu() {
    let (dev, _one_at_a_time) = gpu();
    let (n, k, out) = (37, 64, 96);
    for dtype in [DType::BF16, DType::F16] {
        for w_out_in in [true, false] {
            for act in [Act::None, Act::GeluTanh] {
                let x = randn(&[n, k], &dev).to_dtype(dtype).unwrap();
                let w_shape = if w_out_in { [out, k] } else { [k, out] };
                let w = (randn(&w_shape, &dev) * 0.1)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let b = randn(&[out], &dev).to_dtype(dtype).unwrap();
                let fused = linear(&x, &w, w_out_in, &b, act).unwrap().expect("applies");
                let f32w = w.to_dtype(DType::F32).unwrap();
                let wt = if w_out_in { f32w.t().unwrap() } else { f32w };
                let y = x.to_dtype(DType::F32).unwrap().matmul(&wt).unwrap();
                let y = y.broadcast_add(&b.to_dtype(DType::F32).unwrap()).unwrap();
                let r = rel(&fused, &act_ref(&y, act));
                assert!(r < 1e-2, "{dtype:?} w_out_in={w_out_in} {act:?}: rel {r}");
            }
        }
    }
}

/// The decode GEMV (nn.Linear weights, 1–4 rows) against the f32 product with bias and
/// tanh-GELU, in bf16 and f16, for BLOOM's decode shapes (1024 -> 3072, 4096 -> 1024).
#[test]
fn gemv_matches_the_f32_projection() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(1024, 3072), (4096, 1024), (64, 40)] {
        for rows in 1..=4 {
            for dtype in [DType::BF16, DType::F16] {
                for act in [Act::None, Act::GeluTanh] {
                    let x = randn(&[rows, k], &dev).to_dtype(dtype).unwrap();
                    let w = (randn(&[n, k], &dev) * 0.05)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap();
                    let b = randn(&[n], &dev).to_dtype(dtype).unwrap();
                    let y = gemv(&x, &w, &b, act).unwrap().expect("the GEMV applies");
                    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                    let r = f(&x).matmul(&f(&w).t().unwrap()).unwrap();
                    let r = r.broadcast_add(&f(&b)).unwrap();
                    let r = match act {
                        Act::GeluTanh => r.gelu().unwrap(),
                        _ => r,
                    };
                    let why = format!("{rows}x{k} -> {n} {dtype:?} {act:?}");
                    assert_eq!(y.dims(), [rows, n], "{why}");
                    assert!(rel(&y, &r) < 1e-2, "{why}: {}", rel(&y, &r));
                }
            }
        }
    }
    // Five rows are cuBLASLt's.
    let x = randn(&[5, 64], &dev).to_dtype(DType::BF16).unwrap();
    let w = randn(&[40, 64], &dev).to_dtype(DType::BF16).unwrap();
    let b = randn(&[40], &dev).to_dtype(DType::BF16).unwrap();
    assert!(gemv(&x, &w, &b, Act::None).unwrap().is_none());
}

/// The GEMV with the residual add and LayerNorm in its prologue against the add + norm kernel
/// then the GEMV: the sum bit for bit, the output within about a bf16 rounding of the normed
/// row (the norm's statistics are summed in another order); GPT-2's K = 768 (lanes without a
/// vector), K = 1000 (a partial run of lanes), BLOOM's 4096 (four vectors a lane), an odd N.
#[test]
fn gemv_norm_matches_the_add_norm_then_the_gemv() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(768, 2304), (1000, 40), (4096, 4099)] {
        for dtype in [DType::BF16, DType::F16] {
            for act in [Act::None, Act::GeluTanh] {
                let x = randn(&[1, k], &dev).to_dtype(dtype).unwrap();
                let r = randn(&[1, k], &dev).to_dtype(dtype).unwrap();
                let lw = (randn(&[k], &dev) + 1.).unwrap().to_dtype(dtype).unwrap();
                let lb = randn(&[k], &dev).to_dtype(dtype).unwrap();
                let w = (randn(&[n, k], &dev) * 0.05)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let b = randn(&[n], &dev).to_dtype(dtype).unwrap();
                let (y, s) = gemv_norm(&x, &r, (&lw, &lb, 1e-5), &w, &b, act)
                    .unwrap()
                    .expect("applies");
                let (want_s, normed) = add_layer_norm(&x, &r, &lw, &lb, 1e-5)
                    .unwrap()
                    .expect("applies");
                let want = gemv(&normed, &w, &b, act).unwrap().expect("applies");
                let why = format!("K {k} N {n} {dtype:?} {act:?}");
                assert_eq!(rel(&s, &want_s), 0., "{why}: the sum");
                assert_eq!(y.dims(), [1, n], "{why}");
                assert!(rel(&y, &want) < 1e-2, "{why}: rel {}", rel(&y, &want));
            }
        }
    }
    // Two rows, and a row longer than a column's lanes hold (4104 halves), are not its.
    let norm = |k: usize| {
        (
            randn(&[k], &dev).to_dtype(DType::BF16).unwrap(),
            randn(&[k], &dev).to_dtype(DType::BF16).unwrap(),
        )
    };
    for (rows, k) in [(2, 1024), (1, 4104)] {
        let x = randn(&[rows, k], &dev).to_dtype(DType::BF16).unwrap();
        let w = randn(&[40, k], &dev).to_dtype(DType::BF16).unwrap();
        let b = randn(&[40], &dev).to_dtype(DType::BF16).unwrap();
        let (lw, lb) = norm(k);
        let got = gemv_norm(&x, &x, (&lw, &lb, 1e-5), &w, &b, Act::None).unwrap();
        assert!(got.is_none(), "{rows} x {k}");
    }
}

/// The tensor-core LM head against the f32 product: 1–16 rows, bf16 and f16, GPT-2's head
/// (V = 50257, no multiple of 8, nor of the 16-column tiles), BLOOM's widths, a K of one slice.
#[test]
fn skinny_matches_the_f32_logits() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(768, 50257), (1024, 3072), (4096, 1000), (32, 40)] {
        for rows in [1, 3, 5, 8, 16] {
            for dtype in [DType::BF16, DType::F16] {
                let x = randn(&[rows, k], &dev).to_dtype(dtype).unwrap();
                let w = (randn(&[n, k], &dev) * 0.05)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap();
                let why = format!("{rows}x{k} -> {n} {dtype:?}");
                let y = skinny(&x, &w).unwrap().expect(&why);
                let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                let r = f(&x).matmul(&f(&w).t().unwrap()).unwrap();
                assert_eq!(y.dims(), [rows, n], "{why}");
                assert!(rel(&y, &r) < 1e-2, "{why}: {}", rel(&y, &r));
            }
        }
    }
    // Seventeen rows and a K off the 32-wide slices are cuBLAS's.
    let bf = |dims: &[usize]| randn(dims, &dev).to_dtype(DType::BF16).unwrap();
    assert!(skinny(&bf(&[17, 64]), &bf(&[40, 64])).unwrap().is_none());
    assert!(skinny(&bf(&[4, 48]), &bf(&[40, 48])).unwrap().is_none());
}
