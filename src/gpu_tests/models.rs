//! Whole models on the fused paths against candle's ops: hidden states, training steps, the
//! manual backward against autograd, recomputed activations.

use super::*;
use crate::train::{Backward, Recompute};

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

/// gpt2-tiny with one head of 64 (the fused attention's head size).
fn gpt2_tiny_hs64() -> ModelSpec {
    let mut cfg = crate::models::gpt2::Config::gpt2_tiny();
    cfg.n_head = cfg.n_embd / FLASH_HEAD_SIZE;
    ModelSpec {
        name: "gpt2-tiny-hs64".into(),
        arch: crate::models::Architecture::Gpt2(cfg),
    }
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

/// `--recompute` blocks and mlp on the GPU: bf16, dropout on (hashed masks, the same seed),
/// every gradient equal to the kept-activation step's but for the embedding gradient's
/// atomic order.
#[test]
fn recompute_matches_the_kept_activations_on_cuda() {
    let (dev, _one_at_a_time) = gpu();
    let (mut trainer, ids) = tiny_gpt2_trainer(&dev, DType::BF16, true);
    let mut run = |recompute| {
        trainer.set_recompute(recompute).unwrap();
        set_dropout_seed(7);
        trainer.gradients(std::slice::from_ref(&ids)).unwrap()
    };
    let (loss, grads) = run(Recompute::Off);
    for kind in [Recompute::Blocks, Recompute::Mlp] {
        let (loss_r, grads_r) = run(kind);
        assert_eq!(loss, loss_r, "{kind:?}");
        for ((name, g), (_, g_r)) in grads.iter().zip(&grads_r) {
            let r = rel(g_r, g);
            assert!(r < 1e-5, "{kind:?} {name}: {r}");
        }
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

/// Head size 64 with dropout: the fused kernels draw, and their backward redraws, the hashed
/// masks the autograd path's composed softmax draws (same seed, same order, same bits).
#[test]
fn manual_backward_on_flash_attention_with_dropout_matches_autograd_in_bf16() {
    let worst = manual_vs_autograd_of(gpt2_tiny_hs64(), DType::BF16, true);
    assert!(worst < 5e-2, "worst gradient rel {worst}");
}

/// Dropout on: the manual path draws the hashed masks in the autograd path's order, so the
/// same seed gives the same gradients.
#[test]
fn manual_backward_draws_the_autograd_paths_dropout_masks() {
    let worst = manual_vs_autograd(DType::F32, true);
    assert!(worst < 1e-4, "worst gradient rel {worst}");
}

/// Scoring forwards in bf16 with the fused attention (`--fused prefill`) against every other
/// fused path without it: gpt2 at head size 64, BLOOM (ALiBi) at 64 and 128, right-padded
/// rows; the real positions' hidden states within bf16 rounding. The packed forward (the
/// sequences end to end) against the padded one on the same kernel.
#[test]
fn scoring_forward_on_the_prefill_kernel_matches_the_composed_attention() {
    use clap::ValueEnum;
    let (gpu, _one_at_a_time) = gpu();
    let t = 70;
    let lens = [70usize, 33];
    let ids: Vec<u32> = (0..2 * t as u32).map(|i| (i * 7919) % 50257).collect();
    let ids = Tensor::from_vec(ids, (2, t), &gpu).unwrap();
    let mask: Vec<u32> = (0..2 * t).map(|i| u32::from(i % t < lens[i / t])).collect();
    let mask = Tensor::from_vec(mask, (2, t), &gpu).unwrap();
    let without: Vec<Fused> = Fused::value_variants()
        .iter()
        .copied()
        .filter(|f| !matches!(f, Fused::All | Fused::None | Fused::Prefill))
        .collect();
    let bloom = |hidden_size, n_head| {
        let mut cfg = crate::models::bloom::Config::bloom_tiny();
        (cfg.hidden_size, cfg.n_head) = (hidden_size, n_head);
        ModelSpec {
            name: format!("bloom-tiny-hs{}", hidden_size / n_head),
            arch: crate::models::Architecture::Bloom(cfg),
        }
    };
    for spec in [gpt2_tiny_hs64(), bloom(128, 2), bloom(256, 2)] {
        let src = WeightSource::Random { seed: 0 };
        let mut out = Vec::new();
        for fused in [vec![Fused::All], without.clone()] {
            set_enabled(&fused);
            let model = spec.load(&src, DType::BF16, &gpu).unwrap();
            out.push(model.hidden_states(&ids, &mask).unwrap());
        }
        // The same sequences end to end, through the packed forward (the kernel's path).
        set_enabled(&[Fused::All]);
        let model = spec.load(&src, DType::BF16, &gpu).unwrap();
        let real = |h: &Tensor, i: usize| h.get(i).unwrap().narrow(0, 0, lens[i]).unwrap();
        let rows: Vec<Tensor> = (0..2).map(|i| real(&ids, i)).collect();
        let packed_ids = Tensor::cat(&rows, 0).unwrap().unsqueeze(0).unwrap(); // (1, N)
        let packed = model.hidden_states_packed(&packed_ids, &lens).unwrap();
        let packed = packed.expect("bf16 on CUDA packs").squeeze(0).unwrap(); // (N, C)
        for (i, &len) in lens.iter().enumerate() {
            let r = rel(&real(&out[0], i), &real(&out[1], i));
            eprintln!("{}: row {i} rel {r:.2e}", spec.name);
            assert!(r < 3e-2, "{}: row {i} rel {r}", spec.name);
            let at = lens[..i].iter().sum();
            let p = rel(&packed.narrow(0, at, len).unwrap(), &real(&out[0], i));
            assert!(p < 1e-2, "{}: packed row {i} rel {p}", spec.name);
        }
    }
}
