//! The projections: cuBLASLt with the bias and GELU in its epilogue, the decode GEMV, the
//! tensor-core projections and LM head at a few rows.

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

/// A projection test's case: x (rows, k), W (n, k) and b (n,) in `dtype`, and the f32 reference
/// act(x Wᵀ + b).
struct Case {
    x: Tensor,
    w: Tensor,
    b: Tensor,
    act: Act,
    want: Tensor,
    why: String,
}

/// Every case of `shapes` (k, n) × `rows` × bf16 / f16 × no activation / tanh-GELU.
fn projection_cases(
    dev: &Device,
    shapes: &[(usize, usize)],
    rows: &[usize],
    check: impl Fn(&Case),
) {
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    for &(k, n) in shapes {
        for &m in rows {
            for dtype in [DType::BF16, DType::F16] {
                for act in [Act::None, Act::GeluTanh] {
                    let x = randn(&[m, k], dev).to_dtype(dtype).unwrap();
                    let w = (randn(&[n, k], dev) * 0.05)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap();
                    let b = randn(&[n], dev).to_dtype(dtype).unwrap();
                    let y = f(&x).matmul(&f(&w).t().unwrap()).unwrap();
                    let want = act_ref(&y.broadcast_add(&f(&b)).unwrap(), act);
                    let why = format!("{m}x{k} -> {n} {dtype:?} {act:?}");
                    check(&Case {
                        x,
                        w,
                        b,
                        act,
                        want,
                        why,
                    });
                }
            }
        }
    }
}

/// The decode GEMV (nn.Linear weights, 1–4 rows) against the f32 product with bias and
/// tanh-GELU, in bf16 and f16, for BLOOM's decode shapes (1024 -> 3072, 4096 -> 1024, 1024 ->
/// 4096) and GPT-2's (768 -> 2304, 3072 -> 768), a K of fewer vectors than a block's lanes and
/// one of many rounds a lane; without a bias, as the LM head (`gemv-head`, rows of 8 KB and
/// more). At one row the wide kernels (`gemv-wide`) take every K up to 4096, a partial last
/// block (40 columns) too, and only those.
#[test]
fn gemv_matches_the_f32_projection() {
    use std::sync::atomic::Ordering::Relaxed;
    let (dev, _one_at_a_time) = gpu();
    let shapes = [
        (1024, 3072),
        (4096, 1024),
        (1024, 4096),
        (768, 2304),
        (3072, 768),
        (64, 40),
        (16384, 40),
    ];
    projection_cases(&dev, &shapes, &[1, 2, 3, 4], |c| {
        let wide = WIDE_LAUNCHES.load(Relaxed);
        let y = gemv(&c.x, &c.w, &c.b, c.act).unwrap().expect(&c.why);
        let (m, k) = (c.x.dim(0).unwrap(), c.x.dim(1).unwrap());
        let want_wide = m == 1 && k <= 4096;
        assert_eq!(
            WIDE_LAUNCHES.load(Relaxed) - wide,
            want_wide as usize,
            "{}: wide",
            c.why
        );
        assert_eq!(
            y.dims(),
            [c.x.dim(0).unwrap(), c.w.dim(0).unwrap()],
            "{}",
            c.why
        );
        assert!(rel(&y, &c.want) < 1e-2, "{}: {}", c.why, rel(&y, &c.want));
        if c.act == Act::None {
            let head = gemv_head(&c.x, &c.w).unwrap();
            // Rows of 8 KB and more (bloom-7b1's head; bloom-560m's 2 KB rows stay cuBLAS's).
            let long = c.w.dim(1).unwrap() * c.w.dtype().size_in_bytes() >= 8192;
            assert_eq!(head.is_some(), long, "{}: the head's GEMV applies", c.why);
            if let Some(head) = head {
                let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                let want = f(&c.x).matmul(&f(&c.w).t().unwrap()).unwrap();
                assert!(rel(&head, &want) < 1e-2, "{}: no bias", c.why);
            }
        }
    });
    // Five rows are cuBLASLt's.
    let x = randn(&[5, 64], &dev).to_dtype(DType::BF16).unwrap();
    let w = randn(&[40, 64], &dev).to_dtype(DType::BF16).unwrap();
    let b = randn(&[40], &dev).to_dtype(DType::BF16).unwrap();
    assert!(gemv(&x, &w, &b, Act::None).unwrap().is_none());
}

/// The tensor-core projections (`skinny-proj`, 1–16 rows, bias and tanh-GELU) against the f32
/// product, in bf16 and f16: BLOOM's and GPT-2's decode shapes, one and two 8-column tiles a
/// block (N below and from 2304), partial tiles and partial last rounds of slices at both, a K
/// of one slice, 12 rows (one of 9–15: row g + 8 of a fragment partly there), and through `linear`'s
/// dispatch at 5–16 rows; bloom-7b1's weights stay cuBLASLt's ([`SKINNY_MAX_WEIGHT`]).
#[test]
fn skinny_linear_matches_the_f32_projection() {
    let (dev, _one_at_a_time) = gpu();
    let shapes = [
        (1024, 3072),
        (4096, 1024),
        (768, 2304),
        (1024, 4096),
        (800, 4100),
        (1280, 1001),
        (32, 40),
    ];
    projection_cases(&dev, &shapes, &[1, 3, 5, 8, 12, 16], |c| {
        let y = skinny_linear(&c.x, &c.w, &c.b, c.act)
            .unwrap()
            .expect(&c.why);
        let dims = [c.x.dim(0).unwrap(), c.w.dim(0).unwrap()];
        assert_eq!((y.dims(), y.dtype()), (&dims[..], c.x.dtype()), "{}", c.why);
        assert!(rel(&y, &c.want) < 1e-2, "{}: {}", c.why, rel(&y, &c.want));
        if dims[0] > GEMV_MAX_ROWS {
            let via = linear(&c.x, &c.w, true, &c.b, c.act)
                .unwrap()
                .expect(&c.why);
            assert_eq!(max_abs_diff(&via, &y), 0.0, "{}: through linear", c.why);
        }
    });
    // Seventeen rows, a K off the 32-wide slices, erf-GELU and a weight of more than
    // MAX_WEIGHT elements are cuBLASLt's.
    let bf = |dims: &[usize]| randn(dims, &dev).to_dtype(DType::BF16).unwrap();
    let none = |x: &Tensor, w: &Tensor, act| {
        let b = bf(&[w.dim(0).unwrap()]);
        skinny_linear(x, w, &b, act).unwrap().is_none()
    };
    assert!(none(&bf(&[17, 64]), &bf(&[40, 64]), Act::None));
    assert!(none(&bf(&[8, 48]), &bf(&[40, 48]), Act::None));
    assert!(none(&bf(&[8, 64]), &bf(&[40, 64]), Act::GeluErf));
    assert!(none(&bf(&[8, 4096]), &bf(&[2049, 4096]), Act::None));
}

/// The tensor-core LM head against the f32 product: 1–16 rows (one row's kernel and the 2–16
/// rows' one), bf16 and f16, GPT-2's head (V = 50257, no multiple of 8, nor of the 16-column
/// tiles), BLOOM's widths, a K of one slice.
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

/// The LM head's choice of kernel: one row against a vocabulary that is a multiple of 8 with
/// rows of at most 2 KB (bloom-560m's) takes the tensor-core kernel, and its logits match the
/// f32 product; 3 KB rows (bloom-1b1's) and two rows of the 2 KB head take cuBLAS, 8 KB rows
/// the GEMV.
#[test]
fn lm_head_takes_the_tensor_core_kernel_at_one_short_row() {
    use crate::models::head::lm_head;
    use std::sync::atomic::Ordering::Relaxed;
    let (dev, _one_at_a_time) = gpu();
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let head_launches = || SKINNY_HEAD_LAUNCHES.load(Relaxed);
    for (rows, k, n, takes) in [
        (1, 1024, 4096, true),
        (1, 1536, 4096, false),
        (1, 4096, 1024, false),
        (2, 1024, 4096, false),
    ] {
        let x = randn(&[rows, k], &dev).to_dtype(DType::BF16).unwrap();
        let w = (randn(&[n, k], &dev) * 0.05)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let before = head_launches();
        let y = lm_head(&x, &w).unwrap();
        let why = format!("{rows}x{k} -> {n}");
        assert_eq!(head_launches() - before, usize::from(takes), "{why}");
        let want = f(&x).matmul(&f(&w).t().unwrap()).unwrap();
        assert!(rel(&y, &want) < 1e-2, "{why}: {}", rel(&y, &want));
    }
}
