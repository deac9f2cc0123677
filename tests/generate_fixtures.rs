//! Greedy generation with the KV cache against HF transformers' `generate`: fixtures made by
//! scripts/hf_fixtures/make_generate_fixtures.py (left-padded batches of mixed lengths, fp32,
//! eager attention) on the tiny checkpoints of tests/fixtures, loaded through `--model-dir`'s
//! path. Also: cached decoding computes the logits of a full forward, and bad requests are
//! one-line errors. Built with `--features cuda`, the `cuda` tests run the same checks on the
//! GPU (fp32 ids; fp32/bf16/fp16 logits) and fail without one; run the test binary from the
//! repository root when it was built elsewhere (the fixtures are then found from there).

use candle_core::{DType, Device, Tensor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use transformer_bench::models::generate::{generate, left_pad, Greedy, Phase};
use transformer_bench::models::{CausalLm, ModelSpec, WeightSource};

fn fixture(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let root = if built.exists() {
        built
    } else {
        PathBuf::from("tests/fixtures") // a test binary copied to another host
    };
    root.join(name)
}

fn load_on(name: &str, dtype: DType, device: &Device) -> Box<dyn CausalLm> {
    let dir = fixture(name);
    let spec = ModelSpec::from_dir(&dir).unwrap();
    spec.load(&WeightSource::Dir(dir), dtype, device).unwrap()
}

fn load(name: &str) -> Box<dyn CausalLm> {
    load_on(name, DType::F32, &Device::Cpu)
}

#[derive(Deserialize)]
struct Reference {
    tie_rel: f32,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    new_tokens: usize,
    pad_token_id: u32,
    banned_ids: Vec<u32>,
    prompts: Vec<Vec<u32>>,
    input_ids: Vec<Vec<u32>>,
    attention_mask: Vec<Vec<u32>>,
    /// By device: "cpu", and "cuda" where the GPU host had one.
    results: BTreeMap<String, Generated>,
}

#[derive(Deserialize)]
struct Generated {
    ids: Vec<Vec<u32>>,
    top1: Vec<Vec<f32>>,
    margin: Vec<Vec<f32>>,
}

/// Tokens compared and rows cut short at a tie, over a fixture.
#[derive(Default, Debug)]
struct Agreement {
    compared: usize,
    total: usize,
}

/// Compares `got` with HF's ids row by row. A token where HF's top two scores tie
/// (margin < tie_rel · max(1, |top1|)) may differ: the rest of that row then follows another
/// path and is not compared. Any other difference fails.
fn compare(model: &str, case: &Case, device: &str, tie_rel: f32, got: &[Vec<u32>]) -> Agreement {
    let want = &case.results[device];
    let mut a = Agreement::default();
    for (row, (g, w)) in got.iter().zip(&want.ids).enumerate() {
        a.total += w.len();
        for (j, (x, y)) in g.iter().zip(w).enumerate() {
            let tie = want.margin[row][j] < tie_rel * want.top1[row][j].abs().max(1.);
            if x != y {
                assert!(
                    tie,
                    "{model} {} ({device}) row {row} token {j}: got {x}, HF {y} (margin {:e}); got {g:?}, HF {w:?}",
                    case.name, want.margin[row][j]
                );
                break;
            }
            a.compared += 1;
        }
    }
    a
}

/// `name`: the checkpoint's folder under tests/fixtures; its expected ids are in
/// tests/fixtures/generate/BASENAME.json.
fn assert_generation_matches_hf(name: &str) {
    assert_generation_matches_hf_on(name, &Device::Cpu);
}

/// Every case of the fixture: our left padding is HF's, and the generated ids (fp32, on
/// `device`) are HF's on every device the fixture recorded.
fn assert_generation_matches_hf_on(name: &str, device: &Device) {
    let base = Path::new(name).file_name().unwrap().to_string_lossy();
    let text = std::fs::read_to_string(fixture("generate").join(format!("{base}.json"))).unwrap();
    let reference: Reference = serde_json::from_str(&text).unwrap();
    let model = load_on(name, DType::F32, device);
    let mut agreement = Agreement::default();
    for case in &reference.cases {
        let prompts = left_pad(&case.prompts, case.pad_token_id, device).unwrap();
        assert_eq!(prompts.ids.to_vec2::<u32>().unwrap(), case.input_ids);
        assert_eq!(prompts.mask.to_vec2::<u32>().unwrap(), case.attention_mask);
        let g = Greedy {
            new_tokens: case.new_tokens,
            banned: case.banned_ids.clone(),
        };
        let got = generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap();
        assert_eq!(got.len(), case.prompts.len());
        assert!(got.iter().all(|row| row.len() == case.new_tokens));
        for recorded in case.results.keys() {
            let a = compare(name, case, recorded, reference.tie_rel, &got);
            agreement.compared += a.compared;
            agreement.total += a.total;
        }
    }
    // Ties are rare: nearly every token must have been compared.
    assert!(
        agreement.compared * 10 >= agreement.total * 9,
        "{name}: only {agreement:?} tokens compared"
    );
}

#[test]
fn gpt2_generates_hf_ids_on_left_padded_batches() {
    // Init 0.3, untied head: varied tokens, so a wrong mask or position changes them.
    assert_generation_matches_hf("generate/gpt2-generate");
    assert_generation_matches_hf("gpt2-fixture-logits");
}

#[test]
fn gpt2_with_the_real_vocabulary_generates_hf_ids() {
    assert_generation_matches_hf("gpt2-fixture");
}

#[test]
fn bloom_generates_hf_ids_on_left_padded_batches() {
    // 6 heads (ALiBi's non-power-of-two branch); init 0.3 and an untied head give varied
    // tokens (the tied tiny checkpoints repeat one token whatever the attention does).
    assert_generation_matches_hf("generate/bloom-generate");
    // Residual after the layernorm.
    assert_generation_matches_hf("bloom-fixture-logits");
}

#[test]
fn bloom_with_the_real_vocabulary_generates_hf_ids() {
    assert_generation_matches_hf("bloom-fixture");
}

/// Largest |a − b| over the largest |b|, in f32 on the CPU.
fn rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let f32_cpu = |t: &Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
    };
    let (a, b) = (&f32_cpu(a), &f32_cpu(b));
    let scale = b
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    d.to_scalar::<f32>().unwrap() / scale
}

/// Logits of every position of one unpadded sequence by a full forward, (T, V).
fn full_forward(model: &dyn CausalLm, seq: &[u32], device: &Device) -> Tensor {
    let ids = Tensor::new(seq, device).unwrap().unsqueeze(0).unwrap(); // (1, T)
    let mask = ids.ones_like().unwrap();
    let h = model.hidden_states(&ids, &mask).unwrap(); // (1, T, C)
    model.logits(&h.squeeze(0).unwrap()).unwrap()
}

/// A left-padded batch of three prompts through the cache: prefill, three single-token steps,
/// then a chunk of three tokens at once; after each forward the last logits of every row
/// equal those of a full forward over that row's unpadded sequence so far.
fn assert_cached_decoding_matches_full_forward(name: &str) {
    assert_cached_matches_full_on(name, DType::F32, &Device::Cpu, 1e-5);
}

/// [`assert_cached_decoding_matches_full_forward`] in `dtype` on `device`, within `tol`
/// (largest difference over the largest logit).
fn assert_cached_matches_full_on(name: &str, dtype: DType, device: &Device, tol: f32) {
    let model = load_on(name, dtype, device);
    let prompts = vec![
        vec![5, 17, 300, 42, 9, 77],
        vec![101, 3],
        vec![250, 8, 64, 12],
    ];
    let cont: Vec<Vec<u32>> = vec![
        vec![11, 12, 13, 14, 15, 16],
        vec![200, 201, 202, 203, 204, 205],
        vec![7, 7, 400, 401, 7, 3],
    ];
    let batch = left_pad(&prompts, 0, device).unwrap();
    let mut cache = model.new_cache(3, batch.len() + 6).unwrap();
    let reference: Vec<Tensor> = (0..3)
        .map(|r| {
            let seq = [&prompts[r][..], &cont[r][..]].concat();
            full_forward(model.as_ref(), &seq, device)
        })
        .collect();
    // Forwards after the prefill: (first continuation token, count).
    let chunks = [(0, 1), (1, 1), (2, 1), (3, 3)];
    let mut last = model
        .forward_cached(&batch.ids, &batch.mask, &mut cache)
        .unwrap(); // (B, V)
    for step in 0..=chunks.len() {
        let done = chunks[..step].iter().map(|c| c.1).sum::<usize>();
        for (r, reference) in reference.iter().enumerate() {
            let pos = prompts[r].len() + done - 1;
            let want = reference.get(pos).unwrap();
            let d = rel_diff(&last.get(r).unwrap(), &want);
            assert!(
                d < tol,
                "{name} {dtype:?} row {r} after {done} tokens: rel diff {d:e}"
            );
        }
        let Some(&(from, n)) = chunks.get(step) else {
            break;
        };
        let ids: Vec<u32> = cont
            .iter()
            .flat_map(|c| c[from..from + n].to_vec())
            .collect();
        let ids = Tensor::from_vec(ids, (3, n), device).unwrap(); // (B, n)
        last = model
            .forward_cached(&ids, &ids.ones_like().unwrap(), &mut cache)
            .unwrap();
    }
    assert_eq!(cache.len(), batch.len() + 6);
}

#[test]
fn gpt2_cached_decoding_computes_the_full_forward_logits() {
    assert_cached_decoding_matches_full_forward("generate/gpt2-generate");
    assert_cached_decoding_matches_full_forward("gpt2-fixture-logits");
}

#[test]
fn bloom_cached_decoding_computes_the_full_forward_logits() {
    assert_cached_decoding_matches_full_forward("generate/bloom-generate");
    assert_cached_decoding_matches_full_forward("bloom-fixture-logits");
}

#[test]
fn the_hook_sees_the_prefill_then_every_decode_step() {
    let model = load("gpt2-fixture-logits");
    let prompts = left_pad(&[vec![1, 2, 3], vec![4]], 0, &Device::Cpu).unwrap();
    let mut phases = Vec::new();
    let g = Greedy {
        new_tokens: 4,
        banned: vec![],
    };
    let ids = generate(model.as_ref(), &prompts, &g, &mut |p| {
        phases.push(p);
        Ok(())
    })
    .unwrap();
    assert_eq!(ids.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4]);
    let want = [
        Phase::Prefill,
        Phase::Decode { step: 1 },
        Phase::Decode { step: 2 },
        Phase::Decode { step: 3 },
    ];
    assert_eq!(phases, want);
}

#[test]
fn banned_ids_are_never_generated() {
    let model = load("bloom-fixture-logits");
    let prompts = left_pad(&[vec![9, 8, 7, 6]], 0, &Device::Cpu).unwrap();
    let free = Greedy {
        new_tokens: 6,
        banned: vec![],
    };
    let ids = generate(model.as_ref(), &prompts, &free, &mut |_| Ok(())).unwrap();
    // Ban what was chosen: every token must change.
    let mut banned = ids[0].clone();
    banned.dedup();
    let g = Greedy {
        new_tokens: 6,
        banned: banned.clone(),
    };
    let again = generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap();
    assert!(again[0].iter().all(|id| !banned.contains(id)), "{again:?}");
}

#[test]
fn bad_requests_are_one_line_errors() {
    let model = load("gpt2-fixture-logits"); // n_positions 64
    let prompts = left_pad(&[vec![1; 60], vec![2; 3]], 0, &Device::Cpu).unwrap();
    let run = |new_tokens: usize, banned: Vec<u32>| {
        let g = Greedy { new_tokens, banned };
        generate(model.as_ref(), &prompts, &g, &mut |_| Ok(()))
            .unwrap_err()
            .to_string()
    };
    let zero = run(0, vec![]);
    assert_eq!(zero, "0 new tokens to generate: ask for at least 1");
    let long = run(5, vec![]);
    assert_eq!(
        long,
        "a prompt of 60 tokens + 5 new tokens needs 65 positions, the model has 64: use shorter prompts or fewer new tokens"
    );
    let outside = run(2, vec![512]);
    assert!(
        outside.contains("outside the vocabulary of 512"),
        "{outside}"
    );
    for e in [zero, long, outside] {
        assert!(!e.contains('\n'), "{e}");
    }
}

/// The same checks on a GPU, in CUDA builds (they fail without one).
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    fn gpu() -> Device {
        Device::new_cuda(0).expect("these tests need a CUDA GPU")
    }

    #[test]
    fn generated_ids_match_hf_on_the_gpu() {
        for name in [
            "generate/gpt2-generate",
            "generate/bloom-generate",
            "gpt2-fixture-logits",
            "bloom-fixture-logits",
            "gpt2-fixture",
            "bloom-fixture",
        ] {
            assert_generation_matches_hf_on(name, &gpu());
        }
    }

    /// fp32 to rounding; half precision within a few ulps of the logits' scale (the cached
    /// and the full forward multiply matrices of other shapes, so cuBLAS rounds otherwise).
    #[test]
    fn cached_decoding_computes_the_full_forward_logits_on_the_gpu() {
        for name in ["generate/gpt2-generate", "generate/bloom-generate"] {
            for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 5e-2), (DType::F16, 1e-2)] {
                assert_cached_matches_full_on(name, dtype, &gpu(), tol);
            }
        }
    }
}
