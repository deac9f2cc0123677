//! Numerics against HF transformers: fixtures made by scripts/hf_fixtures/make_fixtures.py
//! (GPT2LMHeadModel, fp32, CPU), loaded through the real `--model-dir` path.

use std::path::{Path, PathBuf};
use transformer_bench::device::{DeviceSpec, Precision};
use transformer_bench::models::{ModelSpec, WeightSource};
use transformer_bench::scenarios::lambada::data::{build_request, score_batch};
use transformer_bench::scenarios::verify::{verify, LambadaReference};
use transformer_bench::tokenizer::TextTokenizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Full logits of the fixture's right-padded batch (lengths 16, 8, 3) against HF's.
fn assert_logits_match_hf(name: &str) {
    let report = verify(&fixture(name), DeviceSpec::Cpu, Precision::Fp32, 16).unwrap();
    let l = report.logits.expect("fixture has reference.safetensors");
    assert_eq!(
        l.n_positions,
        16 + 8 + 3,
        "only unpadded positions are compared"
    );
    assert!(
        l.max_rel_err <= 1e-4,
        "{name}: max rel err {:e}",
        l.max_rel_err
    );
}

/// LAMBADA tokens, log-likelihoods and greedy flags of the fixture's 23 passages against HF's.
fn assert_lambada_matches_hf(name: &str) {
    let report = verify(&fixture(name), DeviceSpec::Cpu, Precision::Fp32, 16).unwrap();
    let c = report.lambada.expect("fixture has lambada_reference.json");
    assert_eq!(c.n_passages, 23);
    assert_eq!(
        c.tokens_equal, c.n_passages,
        "{name}: tokenization differs from HF's GPT-2 BPE"
    );
    assert!(
        c.ll_max_abs_err <= 1e-4,
        "{name}: ll max abs err {:e}",
        c.ll_max_abs_err
    );
    assert_eq!(c.greedy_equal, c.n_passages);
    assert!(
        c.greedy_ref > 0,
        "{name}: the fixture should hold greedy hits to compare"
    );
}

#[test]
fn gpt2_logits_match_hf_on_a_padded_batch() {
    assert_logits_match_hf("gpt2-fixture-logits");
}

#[test]
fn gpt2_lambada_tokens_loglikelihoods_and_greedy_match_hf() {
    assert_lambada_matches_hf("gpt2-fixture");
}

#[test]
fn bloom_logits_match_hf_on_a_padded_batch() {
    // 6 heads (ALiBi's non-power-of-two branch), residual after the layernorm.
    assert_logits_match_hf("bloom-fixture-logits");
}

#[test]
fn bloom_lambada_tokens_loglikelihoods_and_greedy_match_hf() {
    // 3 heads; GPT-2's BPE stands in for BLOOM's tokenizer.
    assert_lambada_matches_hf("bloom-fixture");
}

/// Per-passage results of a fixture model for one batch size.
fn lambada_results(name: &str, batch_size: usize) -> Vec<(f64, bool)> {
    let dir = fixture(name);
    let text = std::fs::read_to_string(dir.join("lambada_reference.json")).unwrap();
    let reference: LambadaReference = serde_json::from_str(&text).unwrap();
    let device = DeviceSpec::Cpu.open().unwrap();
    let model = ModelSpec::from_dir(&dir)
        .unwrap()
        .load(
            &WeightSource::Dir(dir.clone()),
            Precision::Fp32.dtype(),
            &device,
        )
        .unwrap();
    let tok = TextTokenizer::gpt2().unwrap(); // BLOOM fixtures use it as their proxy too
    let requests: Vec<_> = reference
        .passages
        .iter()
        .enumerate()
        .map(|(i, p)| build_request(&tok, i, &p.text, model.max_positions()).unwrap())
        .collect();
    requests
        .chunks(batch_size)
        .flat_map(|b| score_batch(model.as_ref(), b, &device).unwrap())
        .map(|r| (r.ll, r.greedy))
        .collect()
}

#[test]
fn lambada_results_do_not_depend_on_batch_size() {
    // BLOOM too: its ALiBi positions come from the padding mask.
    for name in ["gpt2-fixture", "bloom-fixture"] {
        let one = lambada_results(name, 1);
        for bs in [4, 23] {
            let batched = lambada_results(name, bs);
            for (i, (a, b)) in one.iter().zip(&batched).enumerate() {
                let msg = format!("{name} passage {i}, batch {bs}: ll {} vs {}", a.0, b.0);
                assert!((a.0 - b.0).abs() <= 1e-5, "{msg}");
                assert_eq!(a.1, b.1, "{msg}: greedy flag");
            }
        }
    }
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    use candle_core::Tensor;
    use std::collections::HashMap;
    let src = fixture("gpt2-fixture");
    let dir = tempfile::tempdir().unwrap();
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    // Two shards, split by name, and the index HF writes for them.
    let (mut a, mut b): (HashMap<String, Tensor>, HashMap<String, Tensor>) =
        (HashMap::new(), HashMap::new());
    let mut weight_map = serde_json::Map::new();
    for (name, t) in tensors {
        let (shard, file) = if name.contains(".h.1.") {
            (&mut b, "model-00002-of-00002.safetensors")
        } else {
            (&mut a, "model-00001-of-00002.safetensors")
        };
        weight_map.insert(name.clone(), file.into());
        shard.insert(name, t);
    }
    candle_core::safetensors::save(&a, dir.path().join("model-00001-of-00002.safetensors"))
        .unwrap();
    candle_core::safetensors::save(&b, dir.path().join("model-00002-of-00002.safetensors"))
        .unwrap();
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    for f in ["config.json", "lambada_reference.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let c = verify(dir.path(), DeviceSpec::Cpu, Precision::Fp32, 8)
        .unwrap()
        .lambada
        .unwrap();
    assert_eq!((c.tokens_equal, c.greedy_equal), (23, 23));
    assert!(c.ll_max_abs_err <= 1e-4, "{:e}", c.ll_max_abs_err);
}
