//! The one-row decode attention as a thread-block cluster (`--fused cluster`) and reading its
//! cache before its wait (`cache-first`), against the split kernel and its merge.

use super::*;

/// The split decode attention merged inside a thread-block cluster (`--fused cluster`) gives
/// the logits of the split kernel and `tb_decode_combine`, bit for bit (the same merge in the
/// same order), at caches of 1, 2, 4 and 8 splits of 64 keys (clusters of 2, 4, 8) and 10
/// (past a cluster: the two kernels either way), bf16, head sizes 64 and 128 (GPT-2, BLOOM),
/// with its cached keys read before the wait (`cache-first`) or after; the cluster kernels
/// ran where they apply, and only there, and the cache-first ones only with that path.
#[test]
fn cluster_merged_decode_attention_equals_the_split_kernel_and_its_combine() {
    use super::decode::wide_head_specs;
    use clap::ValueEnum as _;
    use std::sync::atomic::Ordering;
    let (gpu, _one_at_a_time) = gpu();
    let without = |off: &[Fused]| -> Vec<Fused> {
        Fused::value_variants()
            .iter()
            .copied()
            .filter(|f| !matches!(f, Fused::All | Fused::None | Fused::Step) && !off.contains(f))
            .collect()
    };
    // (paths, clustered, cache-first)
    let arms = [
        (without(&[Fused::Cluster]), false, false),
        (without(&[Fused::CacheFirst]), true, false),
        (vec![Fused::All], true, true),
    ];
    for spec in wide_head_specs() {
        for prompt_len in [20u32, 100, 250, 500, 620] {
            let mut logits = Vec::new();
            for (paths, clustered, first) in &arms {
                set_enabled(paths);
                let before = CLUSTER_LAUNCHES.load(Ordering::Relaxed);
                let before_first = CACHE_FIRST_LAUNCHES.load(Ordering::Relaxed);
                logits.push(eager_decode_logits(&gpu, &spec, prompt_len));
                let launched = CLUSTER_LAUNCHES.load(Ordering::Relaxed) - before;
                let launched_first = CACHE_FIRST_LAUNCHES.load(Ordering::Relaxed) - before_first;
                let fits = prompt_len <= 500; // ≤ 8 splits of 64 keys
                let why = format!("{} prompt {prompt_len}", spec.name);
                assert_eq!(launched > 0, *clustered && fits, "{why}");
                assert_eq!(launched_first, launched * *first as usize, "{why}");
            }
            set_enabled(&[Fused::All]);
            for got in &logits[1..] {
                assert_eq!(got, &logits[0], "{} prompt {prompt_len}", spec.name);
            }
        }
    }
}

/// The logits (flattened, f32) of three eager one-row decode steps after a cached prefill of
/// `prompt_len` tokens, bf16 random weights.
fn eager_decode_logits(gpu: &Device, spec: &ModelSpec, prompt_len: u32) -> Vec<f32> {
    let ids: Vec<u32> = (0..prompt_len).map(|i| 1 + i * 7 % 50).collect();
    let prompt = Tensor::new(ids.as_slice(), gpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let real = Tensor::ones((1, prompt_len as usize), DType::U32, gpu).unwrap();
    let model = spec
        .load(&WeightSource::Random { seed: 0 }, DType::BF16, gpu)
        .unwrap();
    let mut cache = model.new_cache(1, prompt_len as usize + 4).unwrap();
    model.forward_cached(&prompt, &real, &mut cache).unwrap();
    let one = Tensor::ones((1, 1), DType::U32, gpu).unwrap();
    let mut steps = Vec::new();
    for id in [11u32, 12, 13] {
        let next = Tensor::new(&[[id]], gpu).unwrap();
        let l = model.forward_cached(&next, &one, &mut cache).unwrap();
        steps.push(l.to_dtype(DType::F32).unwrap().flatten_all().unwrap());
    }
    Tensor::cat(&steps, 0).unwrap().to_vec1::<f32>().unwrap()
}
