//! The one-pass kernels of a layer: bias + activation, LayerNorm, the residual add, the hashed
//! dropout mask, the cross-entropy loss, and the bias and embedding gradients.

use super::*;
use candle_core::Var;

#[test]
fn bias_act_forward_and_backward_match_composed_ops() {
    let (dev, _one_at_a_time) = gpu();
    // 70 columns: the scalar kernels; 96: the 16-byte vector ones.
    for (act, n) in [Act::None, Act::GeluTanh, Act::GeluErf, Act::Relu]
        .into_iter()
        .flat_map(|a| [(a, 70), (a, 96)])
    {
        let x = Var::from_tensor(&randn(&[33, n], &dev)).unwrap();
        let b = Var::from_tensor(&randn(&[n], &dev)).unwrap();
        let g = randn(&[33, n], &dev);
        let run = |fused: bool| {
            let y = if fused {
                bias_act(x.as_tensor(), b.as_tensor(), act)
                    .unwrap()
                    .expect("applies")
            } else {
                act_ref(&x.as_tensor().broadcast_add(b.as_tensor()).unwrap(), act)
            };
            let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let gx = grads.get(x.as_tensor()).unwrap().clone();
            let gb = grads.get(b.as_tensor()).unwrap().clone();
            (y, gx, gb)
        };
        let (y1, gx1, gb1) = run(true);
        let (y0, gx0, gb0) = run(false);
        assert!(
            rel(&y1, &y0) < 1e-5,
            "{act:?} {n} forward {}",
            rel(&y1, &y0)
        );
        assert!(rel(&gx1, &gx0) < 1e-4, "{act:?} {n} dx {}", rel(&gx1, &gx0));
        assert!(
            rel(&gb1, &gb0) < 1e-4,
            "{act:?} {n} dbias {}",
            rel(&gb1, &gb0)
        );
    }
}

/// The LayerNorm kernels against autograd of candle's layer_norm_slow: fp32 to rounding, bf16
/// to a few ulps; 150 rows cover a partial block of the dw/db sums. The backward runs in one
/// pass where C is whole 16-byte vectors, at most 8 a lane (bf16 C 96, 768, 1600, 2048; f32 96,
/// 100, 768), in two elsewhere (bf16 100; f32 1600, 2048).
#[test]
fn layer_norm_forward_and_backward_match_layer_norm_slow() {
    let (dev, _one_at_a_time) = gpu();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        for c in [96, 100, 768, 1600, 2048] {
            let x = Var::from_tensor(
                &(randn(&[3, 50, c], &dev) * 3.)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
            let w = Var::from_tensor(&randn(&[c], &dev).to_dtype(dtype).unwrap()).unwrap();
            let b = Var::from_tensor(&randn(&[c], &dev).to_dtype(dtype).unwrap()).unwrap();
            let g = randn(&[3, 50, c], &dev).to_dtype(dtype).unwrap();
            let run = |fused: bool| {
                let (xt, wt, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
                let y = if fused {
                    layer_norm(xt, wt, bt, 1e-5).unwrap().expect("applies")
                } else {
                    candle_nn::ops::layer_norm_slow(xt, wt, bt, 1e-5).unwrap()
                };
                let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
                let get = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
                [y, get(&x), get(&w), get(&b)]
            };
            let (fused, composed) = (run(true), run(false));
            for (name, (a, b)) in ["y", "dx", "dw", "db"]
                .iter()
                .zip(fused.iter().zip(&composed))
            {
                let r = rel(a, b);
                assert!(r < tol, "{dtype:?} C={c} {name}: rel {r}");
            }
        }
    }
}

/// The LayerNorm backward that adds the residual stream's gradient to its dx: the same dw and
/// db, and res + dx bit for bit as the backward then the residual add (f32 C = 96, 768, 1024;
/// bf16 96, 768, 1280, 1600, 2048: 1 to 8 vectors a lane, 1280 the residual read late with its
/// sum, as gpt2-large; f16 768); Σ_rows res as the bias-gradient kernel's column sum (another
/// order of f32 additions) where C ≤ 1536, none above; 150 rows, and 129 (a last block of one
/// row, seven warps idle); where the one-pass kernel does not apply (bf16 C = 100, f32 C = 2048)
/// it declines.
#[test]
fn layer_norm_bwd_add_is_the_backward_then_the_residual_add() {
    let (dev, _one_at_a_time) = gpu();
    let cases = [(DType::F32, 96), (DType::F32, 768), (DType::F32, 1024)];
    let bf16 = [96, 768, 1280, 1600, 2048].map(|c| (DType::BF16, c));
    let more = [(DType::BF16, 1280), (DType::F16, 768)];
    for (i, (dtype, c)) in cases.into_iter().chain(bf16).chain(more).enumerate() {
        let rows = if i % 2 == 0 { 50 } else { 43 }; // × 3
        let make = |scale: f64| {
            let t = (randn(&[3, rows, c], &dev) * scale).unwrap();
            t.to_dtype(dtype).unwrap()
        };
        let (x, dy, res) = (make(3.), make(1.), make(1.));
        let w = randn(&[c], &dev).to_dtype(dtype).unwrap();
        let got = layer_norm_bwd_add(&x, &w, &dy, &res, 1e-5)
            .unwrap()
            .expect("applies");
        let (dx, dw, db) = layer_norm_bwd(&x, &w, &dy, 1e-5).unwrap().expect("applies");
        let want = residual_add(&res, &dx).unwrap().expect("applies");
        assert_eq!(got.dx.dims(), x.dims());
        assert_eq!(rel(&got.dx, &want), 0., "{dtype:?} C={c} res + dx");
        assert_eq!(rel(&got.dw, &dw), 0., "{dtype:?} C={c} dw");
        assert_eq!(rel(&got.db, &db), 0., "{dtype:?} C={c} db");
        let flat = res.reshape((3 * rows, c)).unwrap();
        let column_sum = bias_grad(&flat).unwrap().expect("applies");
        match got.res_sum {
            Some(s) if c <= 1536 => {
                assert_eq!(s.dims(), [c]);
                let r = rel(&s, &column_sum);
                assert!(r < 1e-5, "{dtype:?} C={c} rows {} Σ res: rel {r}", 3 * rows);
            }
            None if c > 1536 => {}
            other => panic!(
                "{dtype:?} C={c}: Σ res {:?}",
                other.map(|s| s.dims().to_vec())
            ),
        }
    }
    for (dtype, c) in [(DType::BF16, 100), (DType::F32, 2048)] {
        let x = randn(&[4, c], &dev).to_dtype(dtype).unwrap();
        let w = randn(&[c], &dev).to_dtype(dtype).unwrap();
        let declined = layer_norm_bwd_add(&x, &w, &x, &x, 1e-5).unwrap();
        assert!(declined.is_none(), "{dtype:?} C = {c}");
    }
}

/// The vectorised residual add against candle's: f32 exactly; bf16 within one rounding (candle
/// adds in bf16, the kernel in f32, each rounding the exact sum once); a count that is not
/// whole vectors is candle's.
#[test]
fn residual_add_matches_candles_add() {
    let (dev, _one_at_a_time) = gpu();
    for dtype in [DType::F32, DType::BF16] {
        let a = randn(&[37, 96], &dev).to_dtype(dtype).unwrap();
        let b = randn(&[37, 96], &dev).to_dtype(dtype).unwrap();
        let got = residual_add(&a, &b).unwrap().expect("applies");
        let want = (&a + &b).unwrap();
        let tol = if dtype == DType::F32 { 0. } else { 8e-3 };
        assert!(rel(&got, &want) <= tol, "{dtype:?}: {}", rel(&got, &want));
    }
    let odd = randn(&[3, 5], &dev);
    assert!(
        residual_add(&odd, &odd).unwrap().is_none(),
        "15 floats are candle's"
    );
}

/// The hashed mask: about 1 − p kept, survivors scaled by 1/(1 − p), a new mask per draw, and
/// the backward redraws the forward's mask (d/dx Σ dropout(x) ⊙ g = keep/(1 − p) ⊙ g).
#[test]
fn hashed_dropout_keeps_one_minus_p_and_its_backward_reuses_the_mask() {
    let (dev, _one_at_a_time) = gpu();
    let n = 1 << 20;
    let p = 0.1f32;
    let x = Var::from_tensor(&Tensor::ones(n, DType::F32, &dev).unwrap()).unwrap();
    let y = dropout(x.as_tensor(), p).unwrap().expect("applies");
    let y2 = dropout(x.as_tensor(), p).unwrap().expect("applies");
    let ys = y.to_vec1::<f32>().unwrap();
    let kept = ys.iter().filter(|&&v| v != 0.).count() as f64 / n as f64;
    assert!((kept - 0.9).abs() < 0.003, "kept {kept}");
    let scale = 1. / (1. - p);
    assert!(ys.iter().all(|&v| v == 0. || (v - scale).abs() < 1e-6));
    let same = ys
        .iter()
        .zip(y2.to_vec1::<f32>().unwrap())
        .filter(|(a, b)| **a == *b)
        .count();
    assert!(same < n * 85 / 100, "two draws share {same} of {n}");
    let g = randn(&[n], &dev);
    let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
    let dx = grads.get(x.as_tensor()).unwrap();
    assert!(rel(dx, &(&y * &g).unwrap()) < 1e-6);
}

/// The residual add with its branch's hashed dropout in one pass, forward (a + keep(b)) and
/// backward ((a + b, keep(a + b))), bit-equal to the dropout kernel then the add (f32, bf16).
#[test]
fn residual_add_with_dropout_matches_the_two_kernels() {
    let (dev, _one_at_a_time) = gpu();
    let keep = Keep::Hash(0xd20b);
    for dtype in [DType::F32, DType::BF16] {
        let a = randn(&[48, 96], &dev).to_dtype(dtype).unwrap();
        let b = randn(&[48, 96], &dev).to_dtype(dtype).unwrap();
        let fused = residual_add_dropped(&a, &b, &keep, 0.2)
            .unwrap()
            .expect("applies");
        let want = residual_add(&a, &apply_keep(&b, &keep, 0.2).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(rel(&fused, &want), 0., "{dtype:?} forward");
        let (sum, dropped) = residual_add_then_drop(&a, &b, &keep, 0.2)
            .unwrap()
            .expect("applies");
        let want_sum = residual_add(&a, &b).unwrap().unwrap();
        assert_eq!(rel(&sum, &want_sum), 0., "{dtype:?} sum");
        let want_dropped = apply_keep(&want_sum, &keep, 0.2).unwrap();
        assert_eq!(rel(&dropped, &want_dropped), 0., "{dtype:?} dropped");
        assert_eq!(sum.dims(), a.dims());
        assert_eq!(dropped.dims(), a.dims());
    }
    let stored = Keep::Mask(Tensor::ones((4, 8), DType::U8, &dev).unwrap());
    let x = randn(&[4, 8], &dev);
    assert!(residual_add_dropped(&x, &x, &stored, 0.2)
        .unwrap()
        .is_none());
}

/// The training forward's token + position sum in one kernel against the f32 sum of the
/// gathered rows rounded once (f32, bf16: the same bits), T below wpe's rows, an id past the
/// vocabulary giving a zero row.
#[test]
fn embedding_fwd_matches_gather_then_add() {
    let (dev, _one_at_a_time) = gpu();
    let (v, p, c) = (37, 20, 64);
    let ids = Tensor::new(&[[3u32, 0, 36, 3, 7], [1, 2, 3, 4, 36]], &dev).unwrap(); // (2, 5)
    for dtype in [DType::F32, DType::BF16] {
        let wte = randn(&[v, c], &dev).to_dtype(dtype).unwrap();
        let wpe = randn(&[p, c], &dev).to_dtype(dtype).unwrap();
        let got = embedding_fwd(&wte, &wpe, &ids).unwrap().expect("applies");
        let tok = wte.index_select(&ids.flatten_all().unwrap(), 0).unwrap(); // (10, C)
        let pos = wpe.narrow(0, 0, 5).unwrap().repeat((2, 1)).unwrap(); // (10, C)
        let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let want = (f32(&tok) + f32(&pos)).unwrap().to_dtype(dtype).unwrap();
        assert_eq!(got.dims(), [10, c]);
        assert_eq!(rel(&got, &want), 0., "{dtype:?}");
    }
    let wte = randn(&[v, c], &dev);
    let wpe = randn(&[p, c], &dev);
    let past = Tensor::new(&[[40u32, 1]], &dev).unwrap();
    let rows = embedding_fwd(&wte, &wpe, &past).unwrap().expect("applies");
    let first = rows.get(0).unwrap().abs().unwrap().sum_all().unwrap();
    assert_eq!(
        first.to_scalar::<f32>().unwrap(),
        0.,
        "an id past V is a zero row"
    );
}

/// The training step's fused cross-entropy (loss, then the gradient over the logits in place)
/// against the forward kernel and the in-place backward: the same losses and gradient, bit
/// for bit, at a padded vocabulary (1001 of 1024 columns: 16-byte rows) and an unpadded one
/// (1001: the scalar path), in each storage type.
#[test]
fn cross_entropy_fused_is_the_forward_then_the_backward() {
    let (dev, _one_at_a_time) = gpu();
    let targets = Tensor::new(&[0u32, 1000, 3, 517, 999, 42, 7], &dev).unwrap();
    let g = 0.37f32;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for cols in [1001, 1024] {
            let x = (randn(&[7, cols], &dev) * 4.)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let want_loss = cross_entropy(&x, &targets, 1001).unwrap().expect("applies");
            let want = x.copy().unwrap();
            let gs = Tensor::full(g, 7, &dev).unwrap();
            assert!(cross_entropy_bwd_in_place(&want, &targets, &gs, 1001).unwrap());
            let got = x.copy().unwrap();
            let loss = cross_entropy_fused_in_place(&got, &targets, g, 1001)
                .unwrap()
                .expect("applies");
            assert_eq!(rel(&loss, &want_loss), 0., "{dtype:?} {cols}: loss");
            assert_eq!(rel(&got, &want), 0., "{dtype:?} {cols}: gradient");
        }
    }
}

/// The cross-entropy kernels against the composed loss (`--fused none`), fp32 and bf16 logits,
/// a vocabulary that is not a multiple of the block, and logits padded past the vocabulary
/// (a padded lm head): the padded columns are ignored and get a zero gradient.
#[test]
fn cross_entropy_forward_and_backward_match_the_composed_loss() {
    use crate::models::loss::cross_entropy_rows;
    let (dev, _one_at_a_time) = gpu();
    let targets = Tensor::new(&[0u32, 1000, 3, 517, 999, 42, 7], &dev).unwrap();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1e-2)] {
        for cols in [1001, 1024] {
            let x = Var::from_tensor(
                &(randn(&[7, cols], &dev) * 4.)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
            let g = randn(&[7], &dev);
            let mut runs = Vec::new();
            for fused in [Fused::All, Fused::None] {
                set_enabled(&[fused]);
                let loss = cross_entropy_rows(x.as_tensor(), &targets, 1001).unwrap();
                let grads = (&loss * &g).unwrap().sum_all().unwrap().backward().unwrap();
                runs.push((loss, grads.get(x.as_tensor()).unwrap().clone()));
            }
            // In place over a copy of the logits: the same gradient as the fused kernel's.
            set_enabled(&[Fused::All]);
            let over = x.as_tensor().copy().unwrap();
            assert!(cross_entropy_bwd_in_place(&over, &targets, &g, 1001).unwrap());
            let fused_grad = &runs[0].1;
            assert_eq!(rel(&over, fused_grad), 0., "{dtype:?} {cols}: in place");
            let (l, d) = (rel(&runs[0].0, &runs[1].0), rel(&runs[0].1, &runs[1].1));
            assert!(
                l < 1e-5 && d < tol,
                "{dtype:?} {cols}: loss rel {l}, grad rel {d}"
            );
            if cols > 1001 {
                let pad = runs[0].1.narrow(1, 1001, cols - 1001).unwrap();
                let pad = pad.to_dtype(DType::F32).unwrap().abs().unwrap();
                let pad_max = pad.flatten_all().unwrap().max(0).unwrap();
                assert_eq!(
                    pad_max.to_scalar::<f32>().unwrap(),
                    0.,
                    "padded columns' gradient"
                );
            }
        }
    }
}

/// The bias gradient against an f32 column sum on the CPU: gpt2's shapes (8192 rows), row
/// counts below the chunk count and not a multiple of it, columns not a multiple of 32.
#[test]
fn bias_grad_matches_a_column_sum() {
    let (dev, _one_at_a_time) = gpu();
    for dtype in [DType::F32, DType::BF16] {
        for (rows, n) in [(8192, 768), (8192, 2304), (37, 3072), (5, 3), (1000, 50)] {
            let dy = randn(&[rows, n], &dev).to_dtype(dtype).unwrap();
            let got = bias_grad(&dy).unwrap().expect("applies");
            assert_eq!((got.dtype(), got.dims()), (DType::F32, &[n][..]));
            let want = dy
                .to_device(&Device::Cpu)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let want = want.sum(0).unwrap();
            let r = rel(&got, &want);
            assert!(r < 1e-5, "{dtype:?} ({rows}, {n}): {r}");
            let again = bias_grad(&dy).unwrap().unwrap();
            assert_eq!(rel(&again, &got), 0., "a fixed order: the same sum twice");
        }
    }
}

/// The MLP backward's one pass (dx and the bias gradient's first pass in one kernel) against
/// the two passes over dx read back: db bit for bit (the same partials in the same order) on
/// gpt2's fc shape, rows below the chunk count, and widths of one to a few vectors.
#[test]
fn bias_act_bwd_sums_dx_as_the_two_pass_bias_grad_does() {
    let (dev, _one_at_a_time) = gpu();
    for dtype in [DType::F32, DType::BF16] {
        for (rows, n) in [(8192, 3072), (37, 3072), (5, 96), (1000, 64)] {
            let x = randn(&[rows, n], &dev).to_dtype(dtype).unwrap();
            let b = randn(&[n], &dev).to_dtype(dtype).unwrap();
            let dy = randn(&[rows, n], &dev).to_dtype(dtype).unwrap();
            let (dx, db) = bias_act_bwd(&x, &b, &dy, Act::GeluTanh)
                .unwrap()
                .expect("applies");
            assert_eq!((dx.dtype(), dx.dims()), (dtype, &[rows, n][..]));
            assert_eq!((db.dtype(), db.dims()), (DType::F32, &[n][..]));
            let want = bias_grad(&dx).unwrap().expect("applies");
            assert_eq!(rel(&db, &want), 0., "{dtype:?} ({rows}, {n})");
        }
    }
}

/// The embedding gradient's scatter-add against candle's index_add on the CPU: gpt2's shapes
/// with repeated ids (a 1000-token vocabulary for 8192 rows), into a non-zero gradient, as a
/// new tensor and in place.
#[test]
fn embedding_bwd_matches_index_add() {
    let (dev, _one_at_a_time) = gpu();
    let (vocab, rows, c) = (1000, 8192, 768);
    let ids: Vec<u32> = (0..rows as u32)
        .map(|i| (i * 7919) % vocab as u32)
        .collect();
    let ids = Tensor::new(ids.as_slice(), &dev).unwrap();
    let (dst, demb) = (randn(&[vocab, c], &dev), randn(&[rows, c], &dev));
    let got = embedding_bwd(&dst, &ids, &demb).unwrap().expect("applies");
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    let want = cpu(&dst).index_add(&cpu(&ids), &cpu(&demb), 0).unwrap();
    let r = rel(&got, &want);
    assert!(r < 1e-5, "{r}");
    assert_eq!(rel(&cpu(&dst), &cpu(&dst)), 0.);
    // In place, into a view from an offset (the rows after the first): the same sums there,
    // the rows before it untouched.
    let whole = Tensor::cat(&[&randn(&[1, c], &dev), &dst], 0).unwrap();
    let tail = whole.narrow(0, 1, vocab).unwrap();
    let first = cpu(&whole.narrow(0, 0, 1).unwrap());
    assert!(embedding_bwd_in_place(&tail, &ids, &demb).unwrap());
    let r = rel(&tail, &want);
    assert!(r < 1e-5, "in place: {r}");
    assert!(!embedding_bwd_in_place(&dst.t().unwrap(), &ids, &demb).unwrap());
    assert_eq!(rel(&whole.narrow(0, 0, 1).unwrap(), &first), 0.);
}
