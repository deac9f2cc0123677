//! Training against HF: 5 AdamW steps (grad accumulation 2, clip 1.0, linear schedule with
//! warm-up) on CPU fp32, dropout off, from the same initial weights and token blocks as
//! `scripts/hf_fixtures/make_train_fixtures.py` (HF transformers + torch). Losses within 1e-4, every weight
//! after step 5 within 1e-5.

use candle_core::{DType, Device, IndexOp, Tensor};
use std::path::PathBuf;
use transformer_bench::models::{ModelSpec, WeightSource};
use transformer_bench::train::{Hyper, Trainer};

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

fn check(name: &str) {
    let dir = fixture(name);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let hyper: Hyper = serde_json::from_value(reference["hyper"].clone()).unwrap();
    let spec = ModelSpec::from_dir(&dir).unwrap();
    let dev = Device::Cpu;
    let mut trainer = Trainer::new(
        &spec,
        &WeightSource::Dir(dir.clone()),
        DType::F32,
        &dev,
        hyper.clone(),
        false,
    )
    .unwrap();
    let batches = candle_core::safetensors::load(dir.join("batches.safetensors"), &dev).unwrap();
    let ids = batches["input_ids"].to_dtype(DType::U32).unwrap(); // (steps, accum, B, T)
    let steps = reference["steps"].as_array().unwrap();
    for (s, want) in steps.iter().enumerate() {
        let micro: Vec<Tensor> = (0..hyper.grad_accum)
            .map(|a| ids.i((s, a)).unwrap().contiguous().unwrap())
            .collect();
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
    let ours = trainer.named_params();
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

#[test]
fn gpt2_training_matches_hf() {
    check("train-gpt2");
}

#[test]
fn bloom_training_matches_hf() {
    check("train-bloom");
}
