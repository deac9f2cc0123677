//! The manual step against candle's autograd of the model's ops (CPU, fp32): every parameter's
//! gradient, the losses of a few optimizer steps, and the dropout backward's masks.

use super::attention::{attention, attention_bwd, LazyBias};
use super::ops::{dropout, dropout_bwd};
use crate::models::gpt2::Config;
use crate::models::{Architecture, ModelSpec, WeightSource};
use crate::record::Hyper;
use crate::train::trainer::{Backward, Trainer};
use crate::train::Recompute;
use candle_core::{DType, Device, Tensor};

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let max = |t: &Tensor| {
        t.abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    max(&(a - b).unwrap()) / max(b).max(1e-30)
}

/// `b` × `t` token ids below `vocab`, a fixed pseudo-random pattern.
fn ids(b: usize, t: usize, vocab: usize, salt: usize) -> Tensor {
    let v: Vec<u32> = (0..b * t)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32)
        .collect();
    Tensor::from_vec(v, (b, t), &Device::Cpu).unwrap()
}

fn trainer(spec: &ModelSpec, lr: f64, dropout: bool) -> Trainer {
    let hyper = Hyper {
        learning_rate: lr,
        total_steps: 100,
        ..Hyper::default()
    };
    let random = WeightSource::Random { seed: 0 };
    Trainer::new(spec, &random, DType::F32, &Device::Cpu, hyper, dropout).unwrap()
}

/// A GPT-2 unlike the presets: 6 heads of 8, 3 layers, a vocabulary that is no multiple of
/// anything, an untied head and per-layer attention scales.
fn odd_gpt2(activation: &str) -> ModelSpec {
    let mut cfg = Config::gpt2_tiny();
    cfg.vocab_size = 97;
    cfg.n_positions = 32;
    cfg.n_embd = 48;
    cfg.n_layer = 3;
    cfg.n_head = 6;
    cfg.tie_word_embeddings = false;
    cfg.scale_attn_by_inverse_layer_idx = true;
    cfg.activation_function = activation.into();
    ModelSpec {
        name: format!("gpt2-odd-{activation}"),
        arch: Architecture::Gpt2(cfg),
    }
}

/// Moves every weight off its init (LayerNorm weights 1, biases 0 would hide mistakes in
/// their gradients), then compares the two paths' loss and gradients on `batch`.
fn assert_paths_agree(spec: &ModelSpec, batch: &[Tensor]) {
    let mut t = trainer(spec, 1e-2, false);
    t.set_backward(Backward::Autograd).unwrap();
    for _ in 0..2 {
        t.step(batch).unwrap();
    }
    let (loss_a, grads_a) = t.gradients(batch).unwrap();
    t.set_backward(Backward::Manual).unwrap();
    let (loss_m, grads_m) = t.gradients(batch).unwrap();
    assert!(
        (loss_m - loss_a).abs() < 1e-6 * loss_a,
        "{loss_m} vs {loss_a}"
    );
    assert_eq!(grads_m.len(), grads_a.len());
    for ((name, m), (_, a)) in grads_m.iter().zip(&grads_a) {
        let r = rel(m, a);
        assert!(
            r < 1e-5,
            "{}: {name} differs from autograd by {r}",
            spec.name
        );
        assert!(
            a.abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                > 0.
        );
    }
}

#[test]
fn gradients_equal_autograd_on_gpt2_tiny() {
    let spec = ModelSpec::preset("gpt2-tiny").unwrap();
    assert_paths_agree(&spec, &[ids(2, 16, 50257, 0)]);
}

#[test]
fn gradients_equal_autograd_with_other_heads_odd_t_untied_head() {
    for act in ["gelu_new", "gelu", "relu"] {
        let spec = odd_gpt2(act);
        // Two micro-batches: accumulation; T = 13 is odd, below n_positions.
        assert_paths_agree(&spec, &[ids(2, 13, 97, 1), ids(2, 13, 97, 2)]);
    }
}

#[test]
fn optimizer_steps_give_the_same_losses_both_ways() {
    let spec = ModelSpec::preset("gpt2-tiny").unwrap();
    let (mut manual, mut auto) = (trainer(&spec, 1e-3, false), trainer(&spec, 1e-3, false));
    assert_eq!(manual.backward(), Backward::Manual, "GPT-2's default");
    auto.set_backward(Backward::Autograd).unwrap();
    for s in 0..4 {
        let batch = [ids(2, 16, 50257, 10 + s)];
        let (m, a) = (manual.step(&batch).unwrap(), auto.step(&batch).unwrap());
        assert!(
            (m.loss - a.loss).abs() < 1e-5 * a.loss,
            "step {s}: {} vs {}",
            m.loss,
            a.loss
        );
        assert!(
            (m.grad_norm - a.grad_norm).abs() < 1e-5 * a.grad_norm,
            "step {s}"
        );
    }
    // Absolute, as tests/train_fixtures.rs: the key bias's true gradient is 0 (the softmax
    // ignores a per-query constant), so AdamW turns each path's rounding noise into steps of
    // its own there.
    for ((name, m), (_, a)) in manual
        .named_params()
        .unwrap()
        .iter()
        .zip(auto.named_params().unwrap())
    {
        let diff = (m - &a).unwrap().abs().unwrap().max_all().unwrap();
        let diff = diff.to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "{name}: {diff}");
    }
}

#[test]
fn manual_backward_is_refused_for_bloom() {
    let spec = ModelSpec::preset("bloom-tiny").unwrap();
    let mut t = trainer(&spec, 1e-3, false);
    assert_eq!(t.backward(), Backward::Autograd);
    let err = t.set_backward(Backward::Manual).unwrap_err().to_string();
    assert!(err.contains("--backward autograd"), "{err}");
}

/// Dropout is linear in its input, so Σ dx ⊙ x = Σ dy ⊙ y only if the backward applied the
/// forward's mask (a fresh one would break it).
#[test]
fn dropout_backward_applies_the_forward_mask() {
    let x = Tensor::randn(0f32, 1., (64, 48), &Device::Cpu).unwrap();
    let g = Tensor::randn(0f32, 1., (64, 48), &Device::Cpu).unwrap();
    let (y, keep) = dropout(&x, 0.5).unwrap();
    let dx = dropout_bwd(&g, &keep, 0.5).unwrap();
    let dot = |a: &Tensor, b: &Tensor| (a * b).unwrap().sum_all().unwrap().to_scalar::<f32>();
    let (lhs, rhs) = (dot(&dx, &x).unwrap(), dot(&g, &y).unwrap());
    assert!(
        (lhs - rhs).abs() < 1e-4 * rhs.abs().max(1.),
        "{lhs} vs {rhs}"
    );
    assert!(rel(&y, &x) > 0.1, "half the elements dropped");
}

/// out = P_drop v is linear in v: Σ dv ⊙ v = Σ dout ⊙ out only with the forward's mask.
#[test]
fn attention_backward_applies_the_forward_mask() {
    let dev = Device::Cpu;
    let (b, t, nh, hs) = (2, 7, 3, 4);
    let qkv = Tensor::randn(0f32, 1., (b, t, 3 * nh * hs), &dev).unwrap();
    let bias = LazyBias::new(b, t, &dev);
    let (out, kept) = attention(&qkv, nh, &bias, 0.5, 0.5, None).unwrap(); // (B·T, C)
    let g = Tensor::randn(0f32, 1., out.shape(), &dev).unwrap();
    let dqkv = attention_bwd(&kept, &g, 0.5).unwrap(); // (B·T, 3C)
    let c = nh * hs;
    let dv = dqkv.narrow(1, 2 * c, c).unwrap();
    let v = qkv
        .reshape((b * t, 3 * c))
        .unwrap()
        .narrow(1, 2 * c, c)
        .unwrap();
    let dot = |a: &Tensor, b: &Tensor| (a * b).unwrap().sum_all().unwrap().to_scalar::<f32>();
    let (lhs, rhs) = (dot(&dv, &v).unwrap(), dot(&g, &out).unwrap());
    assert!(
        (lhs - rhs).abs() < 1e-4 * rhs.abs().max(1.),
        "{lhs} vs {rhs}"
    );
}

/// `--recompute blocks` runs each block's forward again in the backward, `--recompute mlp` its
/// LayerNorms and the MLP's first matmul: the same loss and the same gradients, bit for bit on
/// the CPU (the same ops in the same order), for gpt2-tiny and the odd config, over two
/// micro-batches.
#[test]
fn recompute_gives_the_same_gradients() {
    for spec in [
        ModelSpec::preset("gpt2-tiny").unwrap(),
        odd_gpt2("gelu_new"),
    ] {
        let Architecture::Gpt2(cfg) = &spec.arch else {
            unreachable!("GPT-2 specs")
        };
        let vocab = cfg.vocab_size;
        let batch = [ids(2, 13, vocab, 1), ids(2, 13, vocab, 2)];
        let t = trainer(&spec, 1e-3, false);
        let (loss, grads) = t.gradients(&batch).unwrap();
        for kind in [Recompute::Blocks, Recompute::Mlp] {
            let mut r = trainer(&spec, 1e-3, false);
            r.set_recompute(kind).unwrap();
            let (loss_r, grads_r) = r.gradients(&batch).unwrap();
            assert_eq!(loss, loss_r, "{} {kind:?}", spec.name);
            for ((name, g), (_, g_r)) in grads.iter().zip(&grads_r) {
                assert_eq!(rel(g_r, g), 0., "{} {kind:?} {name}", spec.name);
            }
        }
    }
}

/// The autograd path has no blocks to checkpoint: --recompute is refused, in one line.
#[test]
fn recompute_is_refused_for_autograd() {
    let spec = ModelSpec::preset("bloom-tiny").unwrap();
    let mut t = trainer(&spec, 1e-3, false);
    let err = t.set_recompute(Recompute::Mlp).unwrap_err().to_string();
    assert!(
        err.contains("--recompute") && err.contains("--backward autograd"),
        "{err}"
    );
    assert!(!err.contains('\n'));
}

/// Small random weights of `cfg`'s shapes, by checkpoint name.
fn random_weights(cfg: &Config) -> super::Gpt2Params {
    let (c, f) = (cfg.n_embd, cfg.n_inner());
    let mut salt = 0;
    super::Gpt2Params::load(cfg, |name| {
        let shape: Vec<usize> = match name.rsplit_once('.').unwrap_or(("", name)) {
            ("wte" | "lm_head", _) => vec![cfg.vocab_size, c],
            ("wpe", _) => vec![cfg.n_positions, c],
            (p, "weight") if p.ends_with("c_attn") => vec![c, 3 * c],
            (p, "bias") if p.ends_with("c_attn") => vec![3 * c],
            (p, "weight") if p.ends_with("c_fc") => vec![c, f],
            (p, "bias") if p.ends_with("c_fc") => vec![f],
            (p, "weight") if p.ends_with("mlp.c_proj") => vec![f, c],
            (p, "weight") if p.ends_with("attn.c_proj") => vec![c, c],
            _ => vec![c],
        };
        salt += 1;
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((i * 7919 + salt * 104_729) % 1000) as f32 / 1000. - 0.5) * 0.1)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
    })
    .unwrap()
}

/// Data parallelism's hook: ln_f's gradients first, then each block's from the last, then the
/// embeddings' (untied head: wte, wpe, lm_head), each group as the plain backward makes it,
/// and what the hook returns is what the backward returns.
#[test]
fn backward_hands_each_gradient_group_to_ready_in_order() {
    let spec = odd_gpt2("gelu_new");
    let Architecture::Gpt2(cfg) = &spec.arch else {
        unreachable!()
    };
    let step = super::Gpt2Step::new(cfg, random_weights(cfg), false, Recompute::Off).unwrap();
    let batch = ids(2, 9, cfg.vocab_size, 0);
    let (_, f) = step.forward(&batch).unwrap();
    let plain = step.backward(f, 1.).unwrap().into_named();
    let (_, f) = step.forward(&batch).unwrap();
    let (mut sizes, mut groups) = (Vec::new(), Vec::new());
    let doubled = step
        .backward_with(f, 1., &mut |group, g| {
            sizes.push(g.len());
            groups.push(group);
            g.iter().map(|t| t * 2.).collect()
        })
        .unwrap()
        .into_named();
    assert_eq!(sizes, [2, 12, 12, 12, 3]);
    use super::params::Group;
    let order = [
        Group::LnF,
        Group::Block(2),
        Group::Block(1),
        Group::Block(0),
        Group::Embeddings,
    ];
    assert_eq!(groups, order);
    let named: Vec<usize> = order.iter().map(|g| g.names(false).len()).collect();
    assert_eq!(named, sizes, "each group's names match its gradients");
    assert_eq!(doubled.len(), plain.len());
    for ((name, d), (plain_name, p)) in doubled.iter().zip(&plain) {
        assert_eq!(name, plain_name);
        assert!(rel(d, &(p * 2.).unwrap()) == 0., "{name}");
        assert!(
            p.abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                > 0.,
            "{name}"
        );
    }
}
