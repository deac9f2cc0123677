//! The fused kernels against candle's composed ops, on a GPU. They exist only in CUDA builds
//! and run on the GPU host (`scripts/gpu_checks.sh kernels`); without a GPU they fail, they
//! do not skip. Each compares the fused path on CUDA with the composed ops (on CUDA, or on
//! the CPU for AdamW); fp32 tolerances are rounding-level, half precision ones a few bf16 ulps.

use super::*;
use crate::models::{attention::causal_padding_bias, ModelSpec, WeightSource};
use crate::train::{Backward, Hyper, Trainer};
use candle_core::{DType, Device, Tensor, Var, D};

/// The tests switch `--fused` process-wide (reference runs use none): one at a time.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gpu() -> (Device, std::sync::MutexGuard<'static, ()>) {
    let guard = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_enabled(&[Fused::All]);
    (
        Device::new_cuda(0).expect("these tests need a CUDA GPU"),
        guard,
    )
}

/// max |a − b| / max |b|, both as f32.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.to_dtype(DType::F32).unwrap(),
        b.to_dtype(DType::F32).unwrap(),
    );
    let a = a.to_device(&Device::Cpu).unwrap();
    let b = b.to_device(&Device::Cpu).unwrap();
    let d = (&a - &b).unwrap().abs().unwrap().flatten_all().unwrap();
    let d = d.max(0).unwrap().to_scalar::<f32>().unwrap();
    let m = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
    d / m.to_scalar::<f32>().unwrap().max(1e-12)
}

fn randn(shape: &[usize], dev: &Device) -> Tensor {
    Tensor::randn(0f32, 1., shape, dev).unwrap()
}

fn act_ref(y: &Tensor, act: Act) -> Tensor {
    match act {
        Act::None => y.clone(),
        Act::GeluTanh => y.gelu().unwrap(),
        Act::GeluErf => y.gelu_erf().unwrap(),
        Act::Relu => y.relu().unwrap(),
    }
}

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

#[test]
fn fused_adamw_takes_the_composed_step() {
    let (gpu, _one_at_a_time) = gpu();
    let hyper = Hyper {
        weight_decay: 0.01,
        ..Hyper::default()
    };
    let init = randn(&[300, 7], &Device::Cpu);
    let mut params = Vec::new();
    let mut opts = Vec::new();
    for dev in [&Device::Cpu, &gpu] {
        let p = Var::from_tensor(&init.to_device(dev).unwrap()).unwrap();
        opts.push(crate::train::AdamW::new(vec![p.clone()], &hyper).unwrap());
        params.push(p);
    }
    for step in 0..3 {
        let g = (randn(&[300, 7], &Device::Cpu) * (step + 1) as f64).unwrap();
        for (opt, dev) in opts.iter_mut().zip([&Device::Cpu, &gpu]) {
            opt.step(&[g.to_device(dev).unwrap()], 1e-3, 0.5).unwrap();
        }
        let r = rel(params[1].as_tensor(), params[0].as_tensor());
        assert!(r < 1e-6, "step {step}: rel {r}");
    }
}

/// gpt2-tiny and bloom-tiny hidden states in fp32 on the GPU: every fused path against
/// `--fused none` (candle's ops; the same random weights, which differ between CPU and GPU).
#[test]
fn models_on_the_fused_path_match_candles_ops() {
    let (gpu, _one_at_a_time) = gpu();
    let ids = Tensor::new(&[[5u32, 9, 2, 7, 1, 3], [4, 8, 6, 0, 0, 0]], &gpu).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], &gpu).unwrap();
    for name in ["gpt2-tiny", "bloom-tiny"] {
        let spec = ModelSpec::preset(name).unwrap();
        let src = WeightSource::Random { seed: 0 };
        let mut out = Vec::new();
        for fused in [Fused::None, Fused::All] {
            set_enabled(&[fused]);
            let model = spec.load(&src, DType::F32, &gpu).unwrap();
            let h = model.hidden_states(&ids, &mask).unwrap();
            out.push(h.narrow(0, 0, 1).unwrap()); // padded rows differ only where masked
        }
        let r = rel(&out[1], &out[0]);
        assert!(r < 1e-5, "{name}: rel {r}");
    }
}

/// Three fp32 training steps of gpt2-tiny without dropout on the GPU, fused against
/// `--fused none`, through autograd and through the manual backward: losses and gradient norms.
#[test]
fn training_steps_on_the_fused_path_match_candles_ops() {
    for backward in [Backward::Autograd, Backward::Manual] {
        training_steps_fused_vs_unfused(backward);
    }
}

fn training_steps_fused_vs_unfused(backward: Backward) {
    let (gpu, _one_at_a_time) = gpu();
    let spec = ModelSpec::preset("gpt2-tiny").unwrap();
    let src = WeightSource::Random { seed: 0 };
    let hyper = Hyper {
        total_steps: 3,
        ..Hyper::default()
    };
    let ids = Tensor::arange(0u32, 64, &gpu)
        .unwrap()
        .reshape((2, 32))
        .unwrap();
    let mut runs = Vec::new();
    for fused in [Fused::None, Fused::All] {
        set_enabled(&[fused]);
        let mut trainer =
            Trainer::new(&spec, &src, DType::F32, &gpu, hyper.clone(), false).unwrap();
        trainer.set_backward(backward).unwrap();
        let steps: Vec<(f64, f64)> = (0..3)
            .map(|_| {
                let o = trainer.step(std::slice::from_ref(&ids)).unwrap();
                (o.loss, o.grad_norm)
            })
            .collect();
        runs.push(steps);
    }
    for ((l0, g0), (l1, g1)) in runs[0].iter().zip(&runs[1]) {
        assert!(
            (l0 - l1).abs() < 1e-5 * l0.abs(),
            "{backward:?}: loss {l0} vs {l1}"
        );
        assert!(
            (g0 - g1).abs() < 1e-4 * g0.abs(),
            "{backward:?}: grad norm {g0} vs {g1}"
        );
    }
}

/// A gpt2-tiny trainer on `dev` (random weights, seed 0) and a (2, 64) batch of ids.
fn tiny_gpt2_trainer(dev: &Device, dtype: DType, dropout: bool) -> (Trainer, Tensor) {
    trainer_of(ModelSpec::preset("gpt2-tiny").unwrap(), dev, dtype, dropout)
}

/// gpt2-tiny with one head of 64 (the fused attention's head size).
fn gpt2_tiny_hs64() -> ModelSpec {
    let mut cfg = crate::models::gpt2::Config::gpt2_tiny();
    cfg.n_head = cfg.n_embd / FLASH_HEAD_SIZE;
    ModelSpec {
        name: "gpt2-tiny-hs64".into(),
        arch: crate::models::Architecture::Gpt2(cfg),
    }
}

/// A trainer of `spec` on `dev` (random weights, seed 0) and a (2, 64) batch of ids.
fn trainer_of(spec: ModelSpec, dev: &Device, dtype: DType, dropout: bool) -> (Trainer, Tensor) {
    let src = WeightSource::Random { seed: 0 };
    let ids: Vec<u32> = (0..2 * 64)
        .map(|i| ((i * 7919 + 13) % 50257) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (2, 64), dev).unwrap();
    let trainer = Trainer::new(&spec, &src, dtype, dev, Hyper::default(), dropout).unwrap();
    (trainer, ids)
}

/// gpt2-tiny's loss and every parameter's gradient through the manual backward and through
/// autograd, on the GPU with the fused kernels, `dropout` on or off (the same seed draws the
/// same hashed masks in both). Returns the worst relative difference of a gradient.
fn manual_vs_autograd(dtype: DType, dropout: bool) -> f32 {
    manual_vs_autograd_of(ModelSpec::preset("gpt2-tiny").unwrap(), dtype, dropout)
}

/// [`manual_vs_autograd`] of `spec`.
fn manual_vs_autograd_of(spec: ModelSpec, dtype: DType, dropout: bool) -> f32 {
    let (dev, _one_at_a_time) = gpu();
    let (mut trainer, ids) = trainer_of(spec, &dev, dtype, dropout);
    let mut run = |backward| {
        trainer.set_backward(backward).unwrap();
        set_dropout_seed(7);
        trainer.gradients(std::slice::from_ref(&ids)).unwrap()
    };
    let (loss_a, grads_a) = run(Backward::Autograd);
    let (loss_m, grads_m) = run(Backward::Manual);
    let loss_tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
    assert!(
        (loss_m - loss_a).abs() < loss_tol * loss_a,
        "{dtype:?}: loss {loss_m} vs {loss_a}"
    );
    let mut worst = 0f32;
    for ((name, m), (_, a)) in grads_m.iter().zip(&grads_a) {
        let r = rel(m, a);
        eprintln!("{dtype:?} dropout={dropout} {name}: rel {r:.2e}");
        worst = worst.max(r);
    }
    worst
}

/// `--recompute` on the GPU: bf16, dropout on (hashed masks, the same seed), every gradient
/// equal to the kept-activation step's but for the embedding gradient's atomic order.
#[test]
fn recompute_matches_the_kept_activations_on_cuda() {
    let (dev, _one_at_a_time) = gpu();
    let (mut trainer, ids) = tiny_gpt2_trainer(&dev, DType::BF16, true);
    let mut run = |recompute| {
        trainer.set_recompute(recompute).unwrap();
        set_dropout_seed(7);
        trainer.gradients(std::slice::from_ref(&ids)).unwrap()
    };
    let (loss, grads) = run(false);
    let (loss_r, grads_r) = run(true);
    assert_eq!(loss, loss_r);
    for ((name, g), (_, g_r)) in grads.iter().zip(&grads_r) {
        let r = rel(g_r, g);
        assert!(r < 1e-5, "{name}: {r}");
    }
}

/// fp32: the two paths round differently only in summation order (cuBLAS, the f32 embedding
/// sums), so every gradient within 1e-4.
#[test]
fn manual_backward_matches_autograd_in_fp32() {
    let worst = manual_vs_autograd(DType::F32, false);
    assert!(worst < 1e-4, "worst gradient rel {worst}");
}

/// bf16: the manual path rounds at other points (cuBLASLt's bias epilogue, f32 embedding
/// gradients, stored instead of recomputed probabilities): a loose bound, a few bf16 ulps.
#[test]
fn manual_backward_matches_autograd_in_bf16() {
    let worst = manual_vs_autograd(DType::BF16, false);
    assert!(worst < 5e-2, "worst gradient rel {worst}");
}

/// Head size 64, no dropout: the manual step's attention is the fused kernels
/// (`flash_attention`), the autograd path's the composed ops; the same loose bound as above.
#[test]
fn manual_backward_on_flash_attention_matches_autograd_in_bf16() {
    let worst = manual_vs_autograd_of(gpt2_tiny_hs64(), DType::BF16, false);
    assert!(worst < 5e-2, "worst gradient rel {worst}");
}

/// Dropout on: the manual path draws the hashed masks in the autograd path's order, so the
/// same seed gives the same gradients.
#[test]
fn manual_backward_draws_the_autograd_paths_dropout_masks() {
    let worst = manual_vs_autograd(DType::F32, true);
    assert!(worst < 1e-4, "worst gradient rel {worst}");
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

/// The LayerNorm kernels against autograd of candle's layer_norm_slow: fp32 to rounding, bf16
/// to a few ulps; 150 rows cover a partial block of the dw/db sums.
#[test]
fn layer_norm_forward_and_backward_match_layer_norm_slow() {
    let (dev, _one_at_a_time) = gpu();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        for c in [96, 768] {
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

/// Σ x² in one kernel (the gradient norm) against square + sum, fp32 and bf16, a length that
/// is not a multiple of the block.
#[test]
fn sum_squares_matches_square_then_sum() {
    let (dev, _one_at_a_time) = gpu();
    for dtype in [DType::F32, DType::BF16] {
        let x = randn(&[(1 << 20) + 7], &dev).to_dtype(dtype).unwrap();
        let got = sum_squares(&x).unwrap().expect("applies");
        let want = x
            .to_dtype(DType::F32)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let (g, w) = (
            got.to_vec1::<f32>().unwrap()[0],
            want.to_scalar::<f32>().unwrap(),
        );
        assert!((g - w).abs() < 1e-4 * w, "{dtype:?}: {g} vs {w}");
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

/// The embedding gradient's scatter-add against candle's index_add on the CPU: gpt2's shapes
/// with repeated ids (a 1000-token vocabulary for 8192 rows), into a non-zero gradient.
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
}

/// The tiny presets with wider heads: gpt2-tiny at head size 64 and bloom-tiny at 128, the
/// sizes the warp-a-key decode attention takes (the presets' 16 take the thread-a-key one).
fn wide_head_specs() -> Vec<ModelSpec> {
    use crate::models::Architecture;
    let (mut gpt2, mut bloom) = (
        crate::models::gpt2::Config::gpt2_tiny(),
        crate::models::bloom::Config::bloom_tiny(),
    );
    gpt2.n_embd = 64 * gpt2.n_head;
    (bloom.hidden_size, bloom.n_head) = (256, 2);
    vec![
        ModelSpec {
            name: "gpt2-tiny-hs64".into(),
            arch: Architecture::Gpt2(gpt2),
        },
        ModelSpec {
            name: "bloom-tiny-hs128".into(),
            arch: Architecture::Bloom(bloom),
        },
    ]
}

/// The decode kernels end to end: a cached prefill and decode steps of gpt2-tiny and
/// bloom-tiny (GPT-2's [q | k | v] and BLOOM's per-head qkv with ALiBi), at their head size
/// and at 64 / 128, a left-padded batch whose keys span two of the attention's 64-key splits,
/// fp32 and bf16, logits of every step with `--fused all` against `--fused none`.
#[test]
fn cached_decoding_on_the_decode_kernels_matches_candles_ops() {
    use crate::models::generate::left_pad;
    let (gpu, _one_at_a_time) = gpu();
    let ids = |n: u32| (0..n).map(|i| 1 + i * 7 % 50).collect::<Vec<u32>>();
    let prompts = left_pad(&[ids(70), ids(41)], 0, &gpu).unwrap();
    let mut specs = vec![
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    specs.extend(wide_head_specs());
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 3e-2)] {
        for spec in &specs {
            let name = &spec.name;
            let src = WeightSource::Random { seed: 0 };
            let mut steps = Vec::new();
            for fused in [Fused::None, Fused::All] {
                set_enabled(&[fused]);
                let model = spec.load(&src, dtype, &gpu).unwrap();
                let mut cache = model.new_cache(2, 80).unwrap();
                let mut logits = vec![model
                    .forward_cached(&prompts.ids, &prompts.mask, &mut cache)
                    .unwrap()];
                let real = Tensor::ones((2, 1), DType::U32, &gpu).unwrap();
                for id in [11u32, 12, 13, 14, 15] {
                    let next = Tensor::new(&[[id], [id + 7]], &gpu).unwrap();
                    logits.push(model.forward_cached(&next, &real, &mut cache).unwrap());
                }
                steps.push(logits);
            }
            for (i, (fused, none)) in steps[1].iter().zip(&steps[0]).enumerate() {
                let r = rel(fused, none);
                assert!(r < tol, "{name} {dtype:?} step {i}: rel {r}");
            }
        }
    }
}

/// The residual add rounds like candle's add; the norm of the sum like candle's layer norm.
#[test]
fn add_layer_norm_matches_the_add_then_the_norm() {
    let (gpu, _one_at_a_time) = gpu();
    // 768 and 4096: a vector a thread; 770: the loop.
    let cases = [(DType::F32, 1e-5), (DType::BF16, 2e-2)]
        .into_iter()
        .flat_map(|d| [768, 4096, 770].map(|c| (d, c)));
    for ((dtype, tol), c) in cases {
        let x = randn(&[3, 5, c], &gpu).to_dtype(dtype).unwrap();
        let r = randn(&[3, 5, c], &gpu).to_dtype(dtype).unwrap();
        let w = randn(&[c], &gpu).to_dtype(dtype).unwrap();
        let b = randn(&[c], &gpu).to_dtype(dtype).unwrap();
        let (sum, normed) = add_layer_norm(&x, &r, &w, &b, 1e-5)
            .unwrap()
            .expect("applies");
        let want_sum = (&x + &r).unwrap();
        assert_eq!(
            rel(&sum, &want_sum),
            0.,
            "{dtype:?} C {c}: the sum rounds as the add"
        );
        let want = candle_nn::ops::layer_norm_slow(&want_sum, &w, &b, 1e-5).unwrap();
        let r = rel(&normed, &want);
        assert!(r < tol, "{dtype:?} C {c}: rel {r}");
    }
}

/// The greedy pick: the first index of the maximum (as torch's argmax, which HF generate
/// uses; bf16 rows tie often), a banned id never chosen.
#[test]
fn argmax_picks_the_first_maximum_and_skips_banned_ids() {
    let (gpu, _one_at_a_time) = gpu();
    // The first index of each row's maximum, on the CPU.
    let first_max = |x: &Tensor| -> Vec<Vec<u32>> {
        let rows = x.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
        rows.iter()
            .map(|r| {
                let m = r.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                vec![r.iter().position(|&a| a == m).unwrap() as u32]
            })
            .collect()
    };
    // A short row in one block; GPT-2's and BLOOM's vocabularies in chunks, then the best of
    // the chunks.
    let cases = [DType::F32, DType::BF16]
        .into_iter()
        .flat_map(|d| [1000, 50257, 250880].map(|v| (d, v)));
    for (dtype, v) in cases {
        let x = randn(&[4, v], &gpu).to_dtype(dtype).unwrap();
        let got = argmax(&x, None).unwrap().expect("applies");
        let want = first_max(&x);
        assert_eq!(got.to_vec2::<u32>().unwrap(), want, "{dtype:?} V {v}");
        let top = want[0][0] as usize;
        let mut ban = vec![0f32; v];
        ban[top] = f32::NEG_INFINITY;
        let ban = Tensor::from_vec(ban, (1, v), &gpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let got = argmax(&x, Some(&ban)).unwrap().expect("applies");
        let want = first_max(&x.broadcast_add(&ban).unwrap());
        assert_eq!(got.to_vec2::<u32>().unwrap(), want, "{dtype:?} banned");
        assert_ne!(got.to_vec2::<u32>().unwrap()[0][0] as usize, top);
    }
    let ties = Tensor::new(&[[1f32, 3., 0., 3., 3.]], &gpu).unwrap();
    let got = argmax(&ties, None).unwrap().expect("applies");
    assert_eq!(got.to_vec2::<u32>().unwrap(), [[1]]);
    // Equal maxima in two chunks of a long row: the first.
    let mut long = vec![0f32; 250880];
    (long[200_001], long[9_000], long[9_001]) = (5., 5., 5.);
    let long = Tensor::from_vec(long, (1, 250880), &gpu).unwrap();
    let got = argmax(&long, None).unwrap().expect("applies");
    assert_eq!(got.to_vec2::<u32>().unwrap(), [[9_000]]);
}

/// Decode steps replayed as a CUDA graph choose the same ids as the eager steps (fp32, greedy,
/// 12 new tokens: one eager step, the capture, ten replays), for both models at their head
/// size and at 64 / 128.
#[test]
fn graph_replayed_decoding_matches_eager_decoding() {
    use crate::models::generate::{generate, left_pad, Greedy};
    let (gpu, _one_at_a_time) = gpu();
    let prompts = left_pad(&[vec![5, 9, 2, 7, 1, 3], vec![4, 8, 6]], 0, &gpu).unwrap();
    let g = Greedy {
        new_tokens: 12,
        banned: vec![],
    };
    let eager_paths = [
        Fused::Lt,
        Fused::Softmax,
        Fused::BiasAct,
        Fused::LayerNorm,
        Fused::Decode,
    ];
    let mut specs = vec![
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    specs.extend(wide_head_specs());
    for spec in &specs {
        let name = &spec.name;
        let src = WeightSource::Random { seed: 0 };
        let mut ids = Vec::new();
        for graph in [false, true] {
            match graph {
                true => set_enabled(&[Fused::All]),
                false => set_enabled(&eager_paths),
            }
            let model = spec.load(&src, DType::F32, &gpu).unwrap();
            let before = replays();
            ids.push(generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap());
            let replayed = replays() - before;
            assert_eq!(
                replayed,
                if graph { 10 } else { 0 },
                "{name}: graph replays"
            );
        }
        assert_eq!(ids[1], ids[0], "{name}");
        assert_eq!(ids[0][0].len(), 12);
    }
}

/// Tensor parallelism over two GPUs (NCCL, a thread a rank): the decode steps replayed as a
/// CUDA graph, each rank's all-reduces recorded in it, choose the one-GPU eager ids (fp32,
/// greedy, 12 new tokens: ten replays a rank). Needs two GPUs, so it runs only when asked
/// (`--ignored`, `scripts/gpu_checks.sh tp-graph`).
#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs two GPUs: scripts/gpu_checks.sh tp-graph runs it"]
fn tp2_graph_replayed_decoding_matches_one_gpu_eager_decoding() {
    use crate::dist::collective::NcclAllReduce;
    use crate::dist::{AllReduce, Tp};
    use crate::models::generate::{generate, left_pad, Greedy};
    use std::sync::Arc;
    let (gpu0, _one_at_a_time) = gpu();
    let prompts = [vec![5, 9, 2, 7, 1, 3], vec![4, 8, 6]];
    let g = Greedy {
        new_tokens: 12,
        banned: vec![],
    };
    let src = WeightSource::Random { seed: 0 };
    for name in ["gpt2-tiny", "bloom-tiny"] {
        let spec = ModelSpec::preset(name).unwrap();
        set_enabled(&[Fused::Lt, Fused::Softmax, Fused::BiasAct, Fused::LayerNorm]);
        let model = spec.load(&src, DType::F32, &gpu0).unwrap();
        let one = generate(
            model.as_ref(),
            &left_pad(&prompts, 0, &gpu0).unwrap(),
            &g,
            &mut |_| Ok(()),
        )
        .unwrap();
        set_enabled(&[Fused::All]);
        let id = NcclAllReduce::new_id().unwrap();
        let before = replays();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (id, spec, prompts, g) = (id.clone(), spec.clone(), prompts.clone(), g.clone());
                std::thread::spawn(move || {
                    let dev = Device::new_cuda_with_stream(rank).expect("a second GPU");
                    if let Device::Cuda(cuda) = &dev {
                        // As a rank of `bench --tp` opens its device (dist::group).
                        // SAFETY: every tensor of this device is used on its one stream.
                        unsafe { cuda.disable_event_tracking() };
                    }
                    let nccl = NcclAllReduce::join(&dev, rank, 2, &id).unwrap();
                    let reduce: Option<Arc<dyn AllReduce>> = Some(Arc::new(nccl));
                    let tp = Tp {
                        rank,
                        size: 2,
                        reduce,
                    };
                    let src = WeightSource::Random { seed: 0 };
                    let model = spec.load_shard(&src, DType::F32, &dev, &tp).unwrap();
                    assert!(
                        model.graph_capturable(),
                        "NCCL's all-reduce can be recorded"
                    );
                    let prompts = left_pad(&prompts, 0, &dev).unwrap();
                    generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap()
                })
            })
            .collect();
        for (rank, r) in ranks.into_iter().enumerate() {
            assert_eq!(r.join().unwrap(), one, "{name} rank {rank}");
        }
        assert_eq!(replays() - before, 20, "{name}: ten replays a rank");
    }
}

/// The multi-tensor update (40 tensors: two launches, chunk tails, one tensor of one element;
/// every third gradient in bf16, as the manual step makes them) against AdamW's composed ops on
/// the CPU with the host's norm and clip factor, loss scale 1 and 1024, three steps.
#[test]
fn multi_tensor_adamw_matches_the_composed_step() {
    let (gpu, _one_at_a_time) = gpu();
    let hyper = Hyper {
        weight_decay: 0.01,
        ..Hyper::default()
    };
    let sizes: Vec<usize> = (0..40)
        .map(|i| [1, 7, 300, 16384, 16385, 50_003][i % 6] + i)
        .collect();
    for loss_scale in [1., 1024.] {
        let init: Vec<Tensor> = sizes.iter().map(|&n| randn(&[n], &Device::Cpu)).collect();
        let cpu_params: Vec<Var> = init.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let mut cpu_opt = crate::train::AdamW::new(cpu_params.clone(), &hyper).unwrap();
        let gpu_params: Vec<Tensor> = init.iter().map(|t| t.to_device(&gpu).unwrap()).collect();
        let moments: Vec<Tensor> = sizes
            .iter()
            .map(|&n| Tensor::zeros((2, n), DType::F32, &gpu).unwrap())
            .collect();
        for step in 1..=3 {
            let stored: Vec<Tensor> = (0..sizes.len())
                .map(|i| {
                    let g = (randn(&[sizes[i]], &Device::Cpu) * (0.01 * loss_scale)).unwrap();
                    match i % 3 {
                        0 => g.to_dtype(DType::BF16).unwrap(),
                        _ => g,
                    }
                })
                .collect();
            // The reference sees the bf16 gradients' values in f32.
            let grads: Vec<Tensor> = stored
                .iter()
                .map(|g| g.to_dtype(DType::F32).unwrap())
                .collect();
            let norm = crate::train::global_grad_norm(&grads).unwrap() / loss_scale;
            let factor = crate::train::clip_coefficient(norm, 1.0) / loss_scale;
            assert!(factor * loss_scale < 1., "the test must clip (norm {norm})");
            let on_gpu: Vec<Tensor> = stored.iter().map(|g| g.to_device(&gpu).unwrap()).collect();
            let clip = grad_norm_clip(&on_gpu, loss_scale, 1.0)
                .unwrap()
                .expect("applies");
            let got = clip.to_vec1::<f32>().unwrap();
            assert!(
                (got[0] as f64 - norm).abs() < 1e-5 * norm,
                "norm {got:?} vs {norm}"
            );
            assert!(
                (got[1] as f64 - factor).abs() < 1e-5 * factor,
                "{got:?} vs {factor}"
            );
            cpu_opt.step(&grads, 1e-3, factor).unwrap();
            let h = AdamStep {
                lr: 1e-3,
                beta1: hyper.beta1,
                beta2: hyper.beta2,
                eps: hyper.eps,
                weight_decay: hyper.weight_decay,
                bc1: 1. - hyper.beta1.powi(step),
                bc2_sqrt: (1. - hyper.beta2.powi(step)).sqrt(),
                grad_scale: 1.,
            };
            let applied = adamw_multi(&gpu_params, &on_gpu, &moments, &h, &clip).unwrap();
            assert!(applied, "the multi-tensor kernel must apply");
            for (i, (g, c)) in gpu_params.iter().zip(&cpu_params).enumerate() {
                let r = rel(g, c.as_tensor());
                assert!(
                    r < 1e-5,
                    "scale {loss_scale} step {step} tensor {i}: rel {r}"
                );
            }
        }
    }
}

/// gpt2-tiny trainer steps with the clip factor on the device (multi-tensor AdamW; in bf16 it
/// reads the bf16 gradients) against the host's norm and candle's AdamW ops on f32 gradients:
/// the same losses, norms and weights, fp32 and bf16.
#[test]
fn trainer_steps_with_the_device_clip_match_the_host_clip() {
    for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 2e-3)] {
        device_clip_against_host_clip(dtype, tol);
    }
}

fn device_clip_against_host_clip(dtype: DType, tol: f64) {
    let (dev, _one_at_a_time) = gpu();
    let (mut device_clip, ids) = tiny_gpt2_trainer(&dev, dtype, false);
    let (mut host_clip, _) = tiny_gpt2_trainer(&dev, dtype, false);
    let without_adamw = [
        Fused::Lt,
        Fused::Softmax,
        Fused::BiasAct,
        Fused::LayerNorm,
        Fused::Dropout,
        Fused::CrossEntropy,
        Fused::Embedding,
        Fused::Heads,
    ];
    for step in 0..3 {
        set_enabled(&[Fused::All]);
        let a = device_clip.step(std::slice::from_ref(&ids)).unwrap();
        set_enabled(&without_adamw);
        let b = host_clip.step(std::slice::from_ref(&ids)).unwrap();
        let why = format!("{dtype:?} step {step}: {a:?} vs {b:?}");
        assert!((a.loss - b.loss).abs() < tol * b.loss, "{why}");
        assert!(
            (a.grad_norm - b.grad_norm).abs() < tol * b.grad_norm,
            "{why}"
        );
    }
    set_enabled(&[Fused::All]);
    let (named_a, named_b) = (
        device_clip.named_params().unwrap(),
        host_clip.named_params().unwrap(),
    );
    for ((name, a), (_, b)) in named_a.iter().zip(&named_b) {
        let r = rel(a, b) as f64;
        assert!(r < tol, "{dtype:?} {name}: rel {r}");
    }
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

/// softmax(q kᵀ·scale + causal) v in f32 from qkv (B, T, 3C), (B, T, C) with heads merged.
fn attention_f32(qkv: &Tensor, nh: usize, scale: f64) -> Tensor {
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
    let y = p.matmul(&v.contiguous().unwrap()).unwrap(); // (B, nh, T, hs)
    y.transpose(1, 2).unwrap().reshape((b, t, nh * hs)).unwrap()
}

/// The fused attention against f32 attention by autograd from the same half-precision
/// inputs: its output and dqkv within a few ulps of the storage type, T a multiple of the
/// 64-row tile and not.
#[test]
fn flash_attention_matches_f32_attention_and_its_autograd() {
    let (dev, _one_at_a_time) = gpu();
    let (b, nh) = (2, 3);
    let c = nh * FLASH_HEAD_SIZE;
    let scale = 1. / (FLASH_HEAD_SIZE as f64).sqrt();
    for dtype in [DType::BF16, DType::F16] {
        for t in [64, 200] {
            let qkv = randn(&[b, t, 3 * c], &dev).to_dtype(dtype).unwrap();
            let dy = randn(&[b, t, c], &dev).to_dtype(dtype).unwrap();
            let (y, lse) = flash_attention(&qkv, nh, scale).unwrap().expect("applies");
            assert_eq!(lse.dims(), [b, nh, t]);
            let dqkv = flash_attention_bwd(&qkv, &y, &lse, &dy, scale)
                .unwrap()
                .expect("applies");
            let x = Var::from_tensor(&qkv.to_dtype(DType::F32).unwrap()).unwrap();
            let want = attention_f32(x.as_tensor(), nh, scale);
            let dy32 = dy.to_dtype(DType::F32).unwrap();
            let grads = (&want * &dy32)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let want_dqkv = grads.get(x.as_tensor()).unwrap();
            let (ry, rg) = (rel(&y, &want), rel(&dqkv, want_dqkv));
            eprintln!("{dtype:?} T={t}: y rel {ry:.2e}, dqkv rel {rg:.2e}");
            assert!(ry < 2e-2, "{dtype:?} T={t}: y rel {ry}");
            assert!(rg < 3e-2, "{dtype:?} T={t}: dqkv rel {rg}");
        }
    }
    let hs32 = randn(&[b, 64, 3 * nh * 32], &dev)
        .to_dtype(DType::BF16)
        .unwrap();
    assert!(
        flash_attention(&hs32, nh, scale).unwrap().is_none(),
        "hs 32 is the matmuls'"
    );
    let f32_qkv = randn(&[b, 64, 3 * c], &dev);
    assert!(
        flash_attention(&f32_qkv, nh, scale).unwrap().is_none(),
        "f32 is the matmuls'"
    );
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

/// The multi-tensor cast against candle's to_dtype, element for element (both round to
/// nearest even), over more tensors than one launch takes and sizes that leave the flat
/// buffer's starts to be padded; every copy starts on a 16-byte boundary.
#[test]
fn cast_multi_matches_to_dtype() {
    let (dev, _one_at_a_time) = gpu();
    let sizes = (0..40).map(|i| [1, 7, 768, 20_001][i % 4] + i);
    let srcs: Vec<Tensor> = sizes.map(|n| randn(&[n], &dev)).collect();
    for dtype in [DType::BF16, DType::F16] {
        let got = cast_multi(&srcs, dtype).unwrap().expect("applies");
        for (g, s) in got.iter().zip(&srcs) {
            assert_eq!((g.dtype(), g.dims()), (dtype, s.dims()));
            assert_eq!(
                rel(g, &s.to_dtype(dtype).unwrap()),
                0.,
                "{dtype:?} {:?}",
                s.dims()
            );
            assert_eq!(g.layout().start_offset() % 8, 0);
        }
    }
    let half = srcs[0].to_dtype(DType::BF16).unwrap();
    assert!(
        cast_multi(&[half], DType::F16).unwrap().is_none(),
        "the sources are f32"
    );
}

/// ZeRO-2 and ZeRO-3 steps on one GPU (one NCCL rank: every shard is the whole unit) against
/// the plain trainer, bf16 with the fused kernels: the gathered blocks, the shards' device
/// clip and the multi-tensor update on shards take the same steps, up to the norm's f32
/// summation order.
#[cfg(feature = "nccl")]
#[test]
fn zero2_and_zero3_steps_match_the_plain_trainer_on_one_gpu() {
    use crate::dist::collective::NcclAllReduce;
    use crate::train::{DataParallel, ZeroStage};
    let (dev, _one_at_a_time) = gpu();
    let id = NcclAllReduce::new_id().unwrap();
    let nccl = std::sync::Arc::new(NcclAllReduce::join(&dev, 0, 1, &id).unwrap());
    for zero in [ZeroStage::Gradients, ZeroStage::Parameters] {
        let (mut plain, ids) = tiny_gpt2_trainer(&dev, DType::BF16, false);
        let (mut sharded, _) = tiny_gpt2_trainer(&dev, DType::BF16, false);
        sharded
            .set_data_parallel(DataParallel {
                rank: 0,
                size: 1,
                reduce: nccl.clone(),
                zero,
                overlap: false,
            })
            .unwrap();
        for step in 0..3 {
            let a = plain.step(std::slice::from_ref(&ids)).unwrap();
            let b = sharded.step(std::slice::from_ref(&ids)).unwrap();
            let why = format!("{zero:?} step {step}: {a:?} vs {b:?}");
            assert!((a.loss - b.loss).abs() < 2e-3 * a.loss, "{why}");
            assert!(
                (a.grad_norm - b.grad_norm).abs() < 2e-3 * a.grad_norm,
                "{why}"
            );
        }
        let (pa, pb) = (
            plain.named_params().unwrap(),
            sharded.named_params().unwrap(),
        );
        for ((name, a), (_, b)) in pa.iter().zip(&pb) {
            assert!(rel(b, a) < 1e-2, "{zero:?} {name}: {}", rel(b, a));
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
