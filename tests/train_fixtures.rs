//! Training against HF: 5 AdamW steps (grad accumulation 2, clip 1.0, linear schedule with
//! warm-up) on CPU fp32, dropout off, from the same initial weights and token blocks as
//! `scripts/hf_fixtures/make_train_fixtures.py` (HF transformers + torch). Losses within 1e-4, every weight
//! after step 5 within 1e-5; the first step's gradient of every parameter within 1e-4
//! relative. GPT-2 both ways (`--backward manual` and `autograd`), BLOOM through autograd.

use candle_core::{DType, Device, IndexOp, Tensor};
use std::path::{Path, PathBuf};
use transformer_bench::models::{ModelSpec, WeightSource};
use transformer_bench::train::{Backward, Hyper, Trainer};

fn fixture(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    assert!(
        dir.join("reference.json").is_file(),
        "{} missing: run `scripts/gpu_checks.sh train-fixtures` (scripts/hf_fixtures/make_train_fixtures.py)",
        dir.display()
    );
    dir
}

fn reference(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

/// The fixture's trainer (its initial weights, fp32, dropout off) computing gradients `backward`.
fn trainer(dir: &Path, hyper: &Hyper, backward: Backward) -> Trainer {
    let spec = ModelSpec::from_dir(dir).unwrap();
    let source = WeightSource::Dir(dir.to_path_buf());
    let dev = Device::Cpu;
    let mut trainer = Trainer::new(&spec, &source, DType::F32, &dev, hyper.clone(), false).unwrap();
    trainer.set_backward(backward).unwrap();
    trainer
}

/// Step `s`'s micro-batches, each (B, T) u32.
fn micro_batches(dir: &Path, s: usize, accum: usize) -> Vec<Tensor> {
    let batches =
        candle_core::safetensors::load(dir.join("batches.safetensors"), &Device::Cpu).unwrap();
    let ids = batches["input_ids"].to_dtype(DType::U32).unwrap(); // (steps, accum, B, T)
    (0..accum)
        .map(|a| ids.i((s, a)).unwrap().contiguous().unwrap())
        .collect()
}

fn check(name: &str, backward: Backward) {
    let dir = fixture(name);
    let reference = reference(&dir);
    let hyper: Hyper = serde_json::from_value(reference["hyper"].clone()).unwrap();
    let mut trainer = trainer(&dir, &hyper, backward);
    let dev = Device::Cpu;
    let steps = reference["steps"].as_array().unwrap();
    for (s, want) in steps.iter().enumerate() {
        let micro = micro_batches(&dir, s, hyper.grad_accum);
        let got = trainer.step(&micro).unwrap();
        let f = |k: &str| want[k].as_f64().unwrap();
        assert!(
            (got.loss - f("loss")).abs() < 1e-4,
            "{name} step {s}: loss {} vs HF {}",
            got.loss,
            f("loss")
        );
        assert!(
            (got.grad_norm - f("grad_norm")).abs() < 1e-4 * f("grad_norm"),
            "{name} step {s}: grad norm {} vs HF {}",
            got.grad_norm,
            f("grad_norm")
        );
        assert!((got.lr - f("lr")).abs() < 1e-12, "{name} step {s}: lr");
    }
    let final_ref = candle_core::safetensors::load(dir.join("final.safetensors"), &dev).unwrap();
    let ours = trainer.named_params().unwrap();
    assert_eq!(ours.len(), final_ref.len(), "{name}: parameter count");
    let initial = candle_core::safetensors::load(dir.join("model.safetensors"), &dev).unwrap();
    let mut moved = 0f32;
    for (n, t) in &ours {
        let key = format!("transformer.{n}");
        let r = final_ref.get(&key).or_else(|| final_ref.get(n)).unwrap();
        let diff = (t - r).unwrap().abs().unwrap().max_all().unwrap();
        let diff: f32 = diff.to_scalar().unwrap();
        assert!(diff < 1e-5, "{name}: {n} differs from HF by {diff}");
        if let Some(i) = initial.get(&key).or_else(|| initial.get(n)) {
            let m: f32 = (r - i)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar()
                .unwrap();
            moved = moved.max(m);
        }
    }
    // The comparison means something only if training moved the weights well past 1e-5.
    assert!(moved > 1e-3, "{name}: weights moved only {moved}");
}

/// The first step's loss and every parameter's gradient (the sum over its micro-batches of
/// ∂(loss / accum), before clipping) against HF's `grads.safetensors`.
fn check_first_gradients(name: &str, backward: Backward) {
    let dir = fixture(name);
    let path = dir.join("grads.safetensors");
    assert!(
        path.is_file(),
        "{} missing: run `scripts/hf_fixtures/make_train_fixtures.py --out tests/fixtures --grads-only`",
        path.display()
    );
    let reference = reference(&dir);
    let hyper: Hyper = serde_json::from_value(reference["hyper"].clone()).unwrap();
    let trainer = trainer(&dir, &hyper, backward);
    let (loss, grads) = trainer
        .gradients(&micro_batches(&dir, 0, hyper.grad_accum))
        .unwrap();
    let want_loss = reference["steps"][0]["loss"].as_f64().unwrap();
    assert!(
        (loss - want_loss).abs() < 1e-6 * want_loss,
        "{name} {backward:?}: first-step loss {loss} vs HF {want_loss}"
    );
    let hf = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    assert_eq!(grads.len(), hf.len(), "{name}: parameter count");
    let max = |t: &Tensor| -> f32 { t.abs().unwrap().max_all().unwrap().to_scalar().unwrap() };
    for (n, g) in &grads {
        let key = format!("transformer.{n}");
        let r = hf.get(&key).or_else(|| hf.get(n)).unwrap();
        let rel = max(&(g - r).unwrap()) / max(r);
        assert!(
            rel < 1e-4,
            "{name} {backward:?}: ∂{n} differs from HF by {rel} (relative)"
        );
    }
}

#[test]
fn gpt2_training_matches_hf() {
    check("train-gpt2", Backward::Manual);
}

#[test]
fn gpt2_training_through_autograd_matches_hf() {
    check("train-gpt2", Backward::Autograd);
}

#[test]
fn bloom_training_matches_hf() {
    check("train-bloom", Backward::Autograd);
}

// The gradient fixtures were made on the GPU host (`bash scripts/gpu_checks.sh train-grads`:
// `make_train_fixtures.py --out tests/fixtures --grads-only`, CPU fp32).
#[test]
fn gpt2_first_step_gradients_match_hf() {
    check_first_gradients("train-gpt2", Backward::Manual);
    check_first_gradients("train-gpt2", Backward::Autograd);
}

#[test]
fn bloom_first_step_gradients_match_hf() {
    check_first_gradients("train-bloom", Backward::Autograd);
}
