//! Attention: the fused softmax (scale, mask, dropout) and its backward, the training path's
//! hashed dropout, the head split and merge, and the tensor-core (flash) attention.

use super::*;
use crate::models::attention::causal_padding_bias;
use candle_core::{Var, D};

/// Tk = 11: the one-block kernels; 24, 512 and 1024: the warp-a-row ones with 1, 2 and 4
/// vectors a lane.
#[test]
fn attn_softmax_matches_scale_bias_softmax_dropout() {
    let (dev, _one_at_a_time) = gpu();
    for t in [11, 24, 512, 1024] {
        attn_softmax_case(&dev, t);
    }
}

fn attn_softmax_case(dev: &Device, t: usize) {
    let dev = dev.clone();
    let b = 2;
    let nh = 3;
    // The second row's last 4 positions are padding.
    let rows: Vec<u32> = (0..2 * t).map(|i| u32::from(i < 2 * t - 4)).collect();
    let mask = Tensor::from_vec(rows, (2, t), &dev).unwrap();
    let causal = causal_padding_bias(&mask).unwrap(); // (B, 1, T, T)
    let per_head = causal.broadcast_add(&randn(&[b, nh, t, t], &dev)).unwrap(); // ALiBi-like
    let s = randn(&[b, nh, t, t], &dev);
    let mask = Tensor::rand(0f32, 1., (b, nh, t, t), &dev)
        .unwrap()
        .ge(0.3)
        .unwrap();
    let (stored, hashed) = (Keep::Mask(mask), Keep::Hash(0x5eed));
    for bias in [&causal, &per_head] {
        for drop in [None, Some((&stored, 0.3f32)), Some((&hashed, 0.3f32))] {
            let (out, probs) = attn_softmax(&s, bias, 0.25, drop, true)
                .unwrap()
                .expect("applies");
            let p = candle_nn::ops::softmax(
                &(&s * 0.25).unwrap().broadcast_add(bias).unwrap(),
                D::Minus1,
            )
            .unwrap();
            // The mask as a tensor: the stored one, or the hash's drawn by its own kernel.
            let keep = drop.map(|(k, q)| keep_mask(k, q, s.shape(), &dev).unwrap());
            let want = match (&keep, drop) {
                (Some(k), Some((_, q))) => (&p * k.to_dtype(DType::F32).unwrap())
                    .unwrap()
                    .affine(1. / (1. - q as f64), 0.)
                    .unwrap(),
                _ => p.clone(),
            };
            assert!(
                rel(&out, &want) < 1e-6,
                "T {t} forward {}",
                rel(&out, &want)
            );
            assert!(rel(&probs.unwrap(), &p) < 1e-6, "T {t}");
            // Backward against autograd of the same composed ops.
            let sv = Var::from_tensor(&s).unwrap();
            let g = randn(&[b, nh, t, t], &dev);
            let pv = candle_nn::ops::softmax(
                &(sv.as_tensor() * 0.25)
                    .unwrap()
                    .broadcast_add(bias)
                    .unwrap(),
                D::Minus1,
            )
            .unwrap();
            let dropped = match (&keep, drop) {
                (Some(k), Some((_, q))) => (&pv * k.to_dtype(DType::F32).unwrap())
                    .unwrap()
                    .affine(1. / (1. - q as f64), 0.)
                    .unwrap(),
                _ => pv,
            };
            let grads = (&dropped * &g)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let ds = attn_softmax_bwd(&p, &g, 0.25, drop)
                .unwrap()
                .expect("applies");
            let r = rel(&ds, grads.get(sv.as_tensor()).unwrap());
            assert!(r < 1e-5, "T {t} backward {r}");
        }
    }
}

/// Half-precision attention softmax: same as the fp32 reference to bf16 rounding.
#[test]
fn attn_softmax_in_bf16_rounds_like_the_f32_reference() {
    let (dev, _one_at_a_time) = gpu();
    let mask = Tensor::new(&[[1u32; 64]], &dev).unwrap();
    let bias = causal_padding_bias(&mask).unwrap();
    let s = (randn(&[1, 4, 64, 64], &dev) * 8.).unwrap();
    let (out, _) = attn_softmax(&s.to_dtype(DType::BF16).unwrap(), &bias, 0.125, None, false)
        .unwrap()
        .expect("applies");
    let want = candle_nn::ops::softmax(
        &(s.to_dtype(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            * 0.125)
            .unwrap()
            .broadcast_add(&bias)
            .unwrap(),
        D::Minus1,
    )
    .unwrap();
    assert!(rel(&out, &want) < 8e-3, "{}", rel(&out, &want));
}

/// Attention with hashed dropout through the training path: out = P_drop v is linear in v, so
/// Σ(∂/∂v ⊙ v) = Σ(out ⊙ g) only if the backward redrew the forward's mask.
#[test]
fn training_attention_backward_redraws_the_hashed_mask() {
    use crate::models::attention::scaled_dot_product;
    use crate::models::layers::{Dropout, Mode};
    let (dev, _one_at_a_time) = gpu();
    let mask = Tensor::new(&[[1u32; 16], [1; 16]], &dev).unwrap();
    let bias = causal_padding_bias(&mask).unwrap();
    let [q, k, v] = [0, 1, 2].map(|_| Var::from_tensor(&randn(&[2, 3, 16, 8], &dev)).unwrap());
    let mode = Mode {
        train: true,
        dropout: Dropout {
            attn: 0.5,
            ..Dropout::default()
        },
    };
    let out = scaled_dot_product(
        q.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        &bias,
        0.35,
        mode,
    )
    .unwrap();
    let g = randn(&[2, 3, 16, 8], &dev);
    let grads = (&out * &g).unwrap().sum_all().unwrap().backward().unwrap();
    let dv = grads.get(v.as_tensor()).unwrap();
    let lhs = (dv * v.as_tensor()).unwrap().sum_all().unwrap();
    let rhs = (&out * &g).unwrap().sum_all().unwrap();
    let (lhs, rhs) = (
        lhs.to_scalar::<f32>().unwrap(),
        rhs.to_scalar::<f32>().unwrap(),
    );
    assert!(
        (lhs - rhs).abs() < 1e-4 * rhs.abs().max(1.),
        "{lhs} vs {rhs}"
    );
}

/// The head split (3 parts and 1) and merge against candle's permute + copy, f32 and bf16,
/// T not a multiple of anything; and a head row of 12 bytes, which they leave to candle.
#[test]
fn head_split_and_merge_match_candles_copies() {
    let (dev, _one_at_a_time) = gpu();
    let (b, t, nh, hs) = (3, 37, 4, 16);
    for dtype in [DType::F32, DType::BF16] {
        for g in [3, 1] {
            let x = randn(&[b, t, g * nh * hs], &dev).to_dtype(dtype).unwrap();
            let got = split_heads(&x, g, nh).unwrap().expect("applies");
            let want = x
                .reshape((b, t, g, nh, hs))
                .unwrap()
                .permute((2, 0, 3, 1, 4))
                .unwrap();
            assert_eq!(got.dims(), want.dims());
            assert_eq!(rel(&got, &want), 0., "{dtype:?} split of {g}");
            let parts: Vec<Tensor> = (0..g).map(|i| got.get(i).unwrap()).collect();
            let refs: Vec<&Tensor> = parts.iter().collect();
            let merged = merge_heads(&refs).unwrap().expect("applies");
            let flat = x.reshape((b * t, g * nh * hs)).unwrap();
            assert_eq!(rel(&merged, &flat), 0., "{dtype:?} merge of {g}");
        }
    }
    let odd = randn(&[b, t, 3 * nh * 3], &dev);
    assert!(
        split_heads(&odd, 3, nh).unwrap().is_none(),
        "hs 3 (12 bytes) is candle's"
    );
}

/// dropout(softmax(q kᵀ·scale + causal)) v in f32 from qkv (B, T, 3C), (B, T, C) with heads
/// merged; `keep`: the dropout's factors (B, nh, T, T) f32 (kept / (1 − p) or 0), or none.
fn attention_f32(qkv: &Tensor, nh: usize, scale: f64, keep: Option<&Tensor>) -> Tensor {
    let (b, t, c3) = qkv.dims3().unwrap();
    let hs = c3 / 3 / nh;
    let split = qkv.reshape((b, t, 3, nh, hs)).unwrap();
    let part = |i: usize| {
        split
            .narrow(2, i, 1)
            .unwrap()
            .squeeze(2)
            .unwrap()
            .transpose(1, 2)
    };
    let (q, k, v) = (part(0).unwrap(), part(1).unwrap(), part(2).unwrap()); // (B, nh, T, hs)
    let mask = Tensor::ones((b, t), DType::U32, qkv.device()).unwrap();
    let bias = causal_padding_bias(&mask).unwrap(); // (B, 1, T, T)
    let s = (q
        .contiguous()
        .unwrap()
        .matmul(&k.t().unwrap().contiguous().unwrap())
        .unwrap()
        * scale)
        .unwrap()
        .broadcast_add(&bias)
        .unwrap();
    // softmax, not softmax_last_dim: the latter's backward is not the softmax's gradient.
    let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
    let p = match keep {
        Some(k) => (p * k).unwrap(),
        None => p,
    };
    let y = p.matmul(&v.contiguous().unwrap()).unwrap(); // (B, nh, T, hs)
    y.transpose(1, 2).unwrap().reshape((b, t, nh * hs)).unwrap()
}

/// The fused attention's dqkv with dq by its own kernel (no atomics) and inside the dk/dv
/// kernel (`flash-dq`): (the latter, the former). dq the same f32 sums in another order, each
/// rounded once to the storage type; dk and dv the same kernel's either way.
fn dqkv_both_ways(
    qkv: &Tensor,
    y: &Tensor,
    lse: &Tensor,
    dy: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
    label: &str,
) -> (Tensor, Tensor) {
    let bwd = || {
        flash_attention_bwd(qkv, y, lse, dy, scale, keep)
            .unwrap()
            .expect("applies")
    };
    set_enabled(&all_but(Fused::FlashDq));
    let own = bwd();
    set_enabled(&[Fused::All]);
    let atomics = bwd();
    let c = qkv.dim(2).unwrap() / 3;
    let q_kv = |x: &Tensor| (x.narrow(2, 0, c).unwrap(), x.narrow(2, c, 2 * c).unwrap());
    let ((dq, dkv), (dq_own, dkv_own)) = (q_kv(&atomics), q_kv(&own));
    let (rq, rkv) = (rel(&dq, &dq_own), rel(&dkv, &dkv_own));
    eprintln!("{label}: dq by atomics against its kernel {rq:.2e}, dk dv {rkv:.2e}");
    assert!(rq < 1e-2, "{label}: dq rel {rq}");
    assert!(rkv < 1e-6, "{label}: dk dv rel {rkv}");
    (atomics, own)
}

/// The fused attention against f32 attention by autograd from the same half-precision
/// inputs: its output and dqkv within a few ulps of the storage type, T a multiple of the
/// 64-row tile and not, with and without dropout (the reference applies the hashed mask as
/// `keep_mask` draws it, so the kernels' element indices are checked too); dq both ways (its
/// own kernel, and atomics in the dk/dv kernel), dk and dv the same from either kernel.
#[test]
fn flash_attention_matches_f32_attention_and_its_autograd() {
    let (dev, _one_at_a_time) = gpu();
    let (b, nh) = (2, 3);
    let c = nh * FLASH_HEAD_SIZE;
    let scale = 1. / (FLASH_HEAD_SIZE as f64).sqrt();
    let hashed = Keep::Hash(0x5eed_f1a5);
    let cases: [(DType, usize, Option<f32>); 7] = [
        (DType::BF16, 64, None),
        (DType::BF16, 200, None),
        (DType::F16, 64, None),
        (DType::F16, 200, None),
        (DType::BF16, 64, Some(0.3)),
        (DType::BF16, 200, Some(0.1)),
        (DType::F16, 200, Some(0.3)),
    ];
    for (dtype, t, p_drop) in cases {
        let keep = p_drop.map(|p| (&hashed, p));
        let factors = p_drop.map(|p| {
            let mask = keep_mask(&hashed, p, &(b, nh, t, t).into(), &dev).unwrap();
            (mask.to_dtype(DType::F32).unwrap() / (1. - p as f64)).unwrap()
        });
        let qkv = randn(&[b, t, 3 * c], &dev).to_dtype(dtype).unwrap();
        let dy = randn(&[b, t, c], &dev).to_dtype(dtype).unwrap();
        let (y, lse) = flash_attention(&qkv, nh, scale, keep)
            .unwrap()
            .expect("applies");
        assert_eq!(lse.dims(), [b, nh, t]);
        let label = format!("{dtype:?} T={t} p={p_drop:?}");
        let (dqkv, dqkv_own) = dqkv_both_ways(&qkv, &y, &lse, &dy, scale, keep, &label);
        let x = Var::from_tensor(&qkv.to_dtype(DType::F32).unwrap()).unwrap();
        let want = attention_f32(x.as_tensor(), nh, scale, factors.as_ref());
        let dy32 = dy.to_dtype(DType::F32).unwrap();
        let grads = (&want * &dy32)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let want_dqkv = grads.get(x.as_tensor()).unwrap();
        let (ry, rg) = (rel(&y, &want), rel(&dqkv, want_dqkv));
        let rg_own = rel(&dqkv_own, want_dqkv);
        eprintln!("{dtype:?} T={t} p={p_drop:?}: y rel {ry:.2e}, dqkv rel {rg:.2e} (own dq kernel {rg_own:.2e})");
        assert!(ry < 2e-2, "{dtype:?} T={t} p={p_drop:?}: y rel {ry}");
        assert!(rg < 3e-2, "{dtype:?} T={t} p={p_drop:?}: dqkv rel {rg}");
        assert!(
            rg_own < 3e-2,
            "{dtype:?} T={t} p={p_drop:?}: dqkv (own dq kernel) rel {rg_own}"
        );
    }
    let stored = Keep::Mask(Tensor::ones((b, nh, 64, 64), DType::U8, &dev).unwrap());
    let qkv = randn(&[b, 64, 3 * c], &dev).to_dtype(DType::BF16).unwrap();
    assert!(
        flash_attention(&qkv, nh, scale, Some((&stored, 0.1)))
            .unwrap()
            .is_none(),
        "a stored mask is the composed path's"
    );
    let odd = randn(&[b, 63, 3 * c], &dev).to_dtype(DType::BF16).unwrap();
    assert!(flash_attention(&odd, nh, scale, None).unwrap().is_some());
    assert!(
        flash_attention(&odd, nh, scale, Some((&hashed, 0.1)))
            .unwrap()
            .is_none(),
        "dropout at an odd T is the composed path's"
    );
    let hs32 = randn(&[b, 64, 3 * nh * 32], &dev)
        .to_dtype(DType::BF16)
        .unwrap();
    assert!(
        flash_attention(&hs32, nh, scale, None).unwrap().is_none(),
        "hs 32 is the matmuls'"
    );
    let f32_qkv = randn(&[b, 64, 3 * c], &dev);
    assert!(
        flash_attention(&f32_qkv, nh, scale, None)
            .unwrap()
            .is_none(),
        "f32 is the matmuls'"
    );
}
