//! Generation: the decode kernels one by one (add + LayerNorm, argmax) and end to end (cached
//! decoding, CUDA-graph replays, tensor parallelism over two GPUs).

use super::*;

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

/// The tiny presets with wider heads: gpt2-tiny at head size 64 and bloom-tiny at 128, the
/// sizes the split (warp-a-key) decode attention takes (the presets' 16 take the thread-a-key
/// one). Their batches have too few (row, head) pairs for the head kernel, which
/// `decode_attention_matches_the_composed_attention` checks.
pub(super) fn wide_head_specs() -> Vec<ModelSpec> {
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
/// and at 64 / 128, left-padded batches of 2 rows (the GEMV) and 6 (the tensor-core
/// projections) whose keys span two of the attention's 64-key splits, fp32 and bf16, logits of
/// every step with `--fused all` against `--fused none`.
#[test]
fn cached_decoding_on_the_decode_kernels_matches_candles_ops() {
    let (gpu, _one_at_a_time) = gpu();
    let mut specs = vec![
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    specs.extend(wide_head_specs());
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 3e-2)] {
        for spec in &specs {
            for rows in [2, 6] {
                let why = format!("{} {dtype:?} {rows} rows", spec.name);
                let steps = [Fused::None, Fused::All]
                    .map(|f| decode_steps(&gpu, spec, dtype, rows, f, false));
                for (i, (fused, none)) in steps[1].iter().zip(&steps[0]).enumerate() {
                    let r = rel(fused, none);
                    assert!(r < tol, "{why} step {i}: rel {r}");
                }
            }
        }
    }
}

/// A CUDA build decoding on the CPU, at a shape the cluster takes on a GPU (one row, head
/// size 64, 4 keys): the decode kernels do not apply and nothing fails (candle's ops run; the
/// cluster's check once asked the CPU device for its CUDA device, a review found).
#[test]
fn decode_attention_on_the_cpu_leaves_it_to_candles_ops() {
    let (_gpu, _one_at_a_time) = gpu();
    let cpu = Device::Cpu;
    let (nh, hs, t_max) = (2, 64, 8);
    let qkv = randn(&[1, 1, 3 * nh * hs], &cpu);
    let (k, v) = (
        randn(&[1, nh, t_max, hs], &cpu),
        randn(&[1, nh, t_max, hs], &cpu),
    );
    let key_mask = Tensor::ones((1, t_max), DType::F32, &cpu).unwrap();
    let key_pos = Tensor::arange(0f32, t_max as f32, &cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let slot = CacheSlot {
        k: &k,
        v: &v,
        key_mask: &key_mask,
        key_pos: &key_pos,
        pos: 3,
        cursor: None,
    };
    let layout = qkv_layout(false, hs, nh * hs);
    let got = decode_attention(&qkv, layout, (nh, hs), &slot, None, 0.125).unwrap();
    assert!(got.is_none());
}

/// A generation's prefill run packed (`prefill_packed`: the prompts' real tokens end to end
/// through the prefill kernel, their keys and values written where left padding puts them)
/// against the padded prefill (`forward_cached`, the composed attention over every column):
/// the first logits and those of three decode steps after each within bf16 rounding, for
/// GPT-2 at head size 64 and BLOOM (ALiBi) at 64 and 128, six prompts of 5–70 tokens (across
/// two of the kernel's 64-row tiles) left-padded to 72 (`--pad-multiple`), bf16, f16 and fp8
/// weights. No packed prefill into a cache that holds positions, nor in f32.
#[test]
fn packed_prefill_matches_the_padded_prefill() {
    use crate::models::generate::left_pad_to;
    let (gpu, _one_at_a_time) = gpu();
    let ids = |n: u32| (0..n).map(|i| 1 + i * 7 % 50).collect::<Vec<u32>>();
    let lens = [70, 41, 5, 33, 64, 20];
    let prompts: Vec<Vec<u32>> = lens.iter().map(|&n| ids(n)).collect();
    let prompts = left_pad_to(&prompts, 0, 72, &gpu).unwrap();
    let mut bloom64 = crate::models::bloom::Config::bloom_tiny();
    (bloom64.hidden_size, bloom64.n_head) = (128, 2);
    let mut specs = wide_head_specs();
    specs.push(ModelSpec {
        name: "bloom-tiny-hs64".into(),
        arch: crate::models::Architecture::Bloom(bloom64),
    });
    let src = WeightSource::Random { seed: 0 };
    let weights = [
        (DType::BF16, false),
        (DType::F16, false),
        (DType::BF16, true),
    ];
    for (spec, (dtype, fp8)) in specs.iter().flat_map(|s| weights.map(|w| (s, w))) {
        let mut model = spec.load(&src, dtype, &gpu).unwrap();
        if fp8 {
            model.quantize_fp8().unwrap();
        }
        let model = model;
        let (p, rows) = (&prompts, lens.len());
        let steps = |packed: bool| -> Vec<Tensor> {
            let mut cache = model.new_cache(rows, 80).unwrap();
            let first = match packed {
                true => model.prefill_packed(&p.ids, &p.lens, &mut cache),
                false => model.forward_cached(&p.ids, &p.mask, &mut cache).map(Some),
            };
            let first = first.unwrap().expect("bf16 / f16 on CUDA prefills packed");
            assert_eq!(
                cache.len(),
                p.len(),
                "the cache holds the padded prompts' columns"
            );
            let real = Tensor::ones((rows, 1), DType::U32, &gpu).unwrap();
            let mut logits = vec![first];
            for id in [11u32, 12, 13] {
                let next: Vec<u32> = (0..rows as u32).map(|r| id + 7 * r).collect();
                let next = Tensor::from_vec(next, (rows, 1), &gpu).unwrap();
                logits.push(model.forward_cached(&next, &real, &mut cache).unwrap());
            }
            logits
        };
        let (padded, packed) = (steps(false), steps(true));
        for (i, (a, b)) in packed.iter().zip(&padded).enumerate() {
            let r = rel(a, b);
            eprintln!("{} {dtype:?} fp8 {fp8} step {i}: rel {r:.2e}", spec.name);
            assert!(
                r < 3e-2,
                "{} {dtype:?} fp8 {fp8} step {i}: rel {r}",
                spec.name
            );
        }
        // A cache that holds positions is the padded forward's (the packed attention attends
        // the prompts' own tokens only).
        let mut cache = model.new_cache(rows, 80).unwrap();
        model.forward_cached(&p.ids, &p.mask, &mut cache).unwrap();
        let again = model.prefill_packed(&p.ids, &p.lens, &mut cache);
        assert!(
            again.unwrap().is_none(),
            "{}: a cache with positions",
            spec.name
        );
    }
    let model = specs[0].load(&src, DType::F32, &gpu).unwrap();
    let mut cache = model.new_cache(lens.len(), 80).unwrap();
    let f32_packed = model.prefill_packed(&prompts.ids, &prompts.lens, &mut cache);
    assert!(f32_packed.unwrap().is_none(), "f32 is the padded forward's");
}

/// The logits of a cached prefill of `rows` left-padded prompts (70, 41, 5, 33, 64, 20 tokens)
/// and five decode steps after it, with only `fused` on (and, with `all`, the weights laid out
/// for decoding as the engine lays them: GPT-2's as nn.Linear's), the weights fp8 if `fp8`.
pub(super) fn decode_steps(
    gpu: &Device,
    spec: &ModelSpec,
    dtype: DType,
    rows: usize,
    fused: Fused,
    fp8: bool,
) -> Vec<Tensor> {
    use crate::models::generate::left_pad;
    let ids = |n: u32| (0..n).map(|i| 1 + i * 7 % 50).collect::<Vec<u32>>();
    let prompts: Vec<Vec<u32>> = [70, 41, 5, 33, 64, 20][..rows]
        .iter()
        .map(|&n| ids(n))
        .collect();
    let prompts = left_pad(&prompts, 0, gpu).unwrap();
    set_enabled(&[fused]);
    let mut model = spec
        .load(&WeightSource::Random { seed: 0 }, dtype, gpu)
        .unwrap();
    if fp8 {
        model.quantize_fp8().unwrap();
    }
    if fused == Fused::All {
        model.prepare_decode().unwrap();
    }
    let mut cache = model.new_cache(rows, 80).unwrap();
    let mut logits = vec![model
        .forward_cached(&prompts.ids, &prompts.mask, &mut cache)
        .unwrap()];
    let real = Tensor::ones((rows, 1), DType::U32, gpu).unwrap();
    for id in [11u32, 12, 13, 14, 15] {
        let next: Vec<u32> = (0..rows as u32).map(|r| id + 7 * r).collect();
        let next = Tensor::from_vec(next, (rows, 1), gpu).unwrap();
        logits.push(model.forward_cached(&next, &real, &mut cache).unwrap());
    }
    logits
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
            if graph {
                assert!(programmatic_edges() > 0, "{name}: a programmatic edge");
            }
        }
        assert_eq!(ids[1], ids[0], "{name}");
        assert_eq!(ids[0][0].len(), 12);
    }
}

/// Programmatic edges (`--fused pdl`) change when a decode kernel's blocks start, not what
/// they compute: bf16 greedy ids of graph replays with and without them, and of eager steps,
/// are identical (one and three rows: the GEMVs, one folded; six rows: the folded tensor-core
/// projections), with the norms and the merge triggering first (`trigger-first`) and waiting
/// first, and only graphs captured with the path on at most four rows have such edges.
#[test]
fn programmatic_edges_leave_graph_replayed_ids_unchanged() {
    use crate::models::generate::{generate, left_pad, Greedy};
    let (gpu, _one_at_a_time) = gpu();
    let g = Greedy {
        new_tokens: 12,
        banned: vec![],
    };
    let mut specs = vec![
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    specs.extend(wide_head_specs());
    let rows: Vec<Vec<u32>> = (0..6)
        .map(|r| (0..3 + r).map(|t| 1 + 7 * t + r).collect())
        .collect();
    // `all` without one path (all_but would switch the opt-in step kernel on).
    let all_without = |off: Fused| -> Vec<Fused> {
        all_but(off)
            .into_iter()
            .filter(|&f| f != Fused::Step)
            .collect()
    };
    let arms = [
        ("without pdl", all_without(Fused::Pdl), false),
        ("all", vec![Fused::All], true),
        ("pdl, waiting first", all_without(Fused::TriggerFirst), true),
        ("eager", all_without(Fused::Graph), false),
    ];
    for (spec, n) in specs.iter().flat_map(|s| [1, 3, 6].map(|n| (s, n))) {
        let prompts = left_pad(&rows[..n], 0, &gpu).unwrap();
        let mut ids = Vec::new();
        for (arm, paths, pdl) in &arms {
            set_enabled(paths);
            let mut model = spec
                .load(&WeightSource::Random { seed: 0 }, DType::BF16, &gpu)
                .unwrap();
            model.prepare_decode().unwrap();
            model.fold_norms(1).unwrap(); // folded: six rows take the folded tensor-core kernels
            let before = replays();
            ids.push(generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap());
            let (graph, why) = (*arm != "eager", format!("{}, {n} rows, {arm}", spec.name));
            assert_eq!(replays() - before, 10 * graph as usize, "{why}: replays");
            let (edges, want) = (programmatic_edges(), *pdl && n <= 4); // the last graph's
            assert!(!graph || (edges > 0) == want, "{why}: {edges} edges");
        }
        for (arm, got) in arms.iter().zip(&ids).skip(1) {
            assert_eq!(got, &ids[0], "{}, {n} rows, {}", spec.name, arm.0);
        }
    }
}

/// Continuous batching (`models::slots`) on the decode kernels (`--fused all`; its steps are
/// eager, never a graph): every request's fp32 greedy ids are those of its prompt generated
/// alone, as on the CPU. Prompts of 2 to 90 tokens, so that rows' keys start and end inside
/// different 64-key splits of the attention, a 90-token prompt joining after fewer columns,
/// compaction, slots reused; both models at their head size and at 64 / 128.
#[test]
fn continuous_batching_on_the_decode_kernels_gives_each_prompt_its_offline_ids() {
    use crate::models::slots::tests::{check_offline_ids, req};
    let (gpu, _one_at_a_time) = gpu();
    let reqs = [
        req(0, 70, 6, 1),
        req(0, 3, 2, 2),
        req(2, 90, 5, 3),
        req(3, 2, 1, 4),
        req(3, 40, 7, 5),
        req(6, 7, 40, 6),
        req(6, 66, 9, 7),
        req(9, 3, 3, 8),
    ];
    let mut specs = vec![
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    specs.extend(wide_head_specs());
    check_offline_ids(&specs, &reqs, &gpu);
}

/// Tensor parallelism over two GPUs (NCCL, a thread a rank): the decode steps replayed as a
/// CUDA graph, each rank's all-reduces recorded in it, choose the one-GPU eager ids (fp32,
/// greedy, 12 new tokens: ten replays a rank). Needs two GPUs, so it runs only when asked
/// (`--ignored`, `scripts/gpu_checks.sh tp-graph`).
#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs two GPUs: scripts/gpu_checks.sh multi-smoke runs it"]
fn tp2_graph_replayed_decoding_matches_one_gpu_eager_decoding() {
    use crate::dist::nccl::NcclAllReduce;
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

/// The decode attention against candle's ops over the same cache: split over 64-key blocks and
/// merged (few heads, or caches past 256 keys), and a block a head over every key (128 (row,
/// head) pairs or more); head sizes 64 and 128, GPT-2's and BLOOM's qkv layouts, ALiBi,
/// padding keys, f32 / bf16 / f16; with a device cursor (a graph's step: every position's
/// room, splits past the last key) and without; the new key and value land in the cache.
#[test]
fn decode_attention_matches_the_composed_attention() {
    let (gpu, _one_at_a_time) = gpu();
    // (rows, heads, head size, T_max, pos, BLOOM's layout with ALiBi, cursor)
    let cases = [
        (1, 4, 128, 300, 257, true, false),
        (2, 3, 64, 200, 130, false, false),
        (16, 8, 64, 256, 200, false, false),
        (4, 32, 128, 160, 99, true, false),
        (16, 16, 64, 96, 0, true, false),
        (1, 4, 128, 300, 100, true, true),
        (16, 8, 64, 256, 70, false, true),
        (16, 8, 128, 320, 150, true, true),
    ];
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2), (DType::F16, 1e-2)] {
        for (b, nh, hs, t_max, pos, bloom, cursor) in cases {
            let what =
                format!("{dtype:?} B {b} nh {nh} hs {hs} T_max {t_max} pos {pos} cursor {cursor}");
            let shape = (b, nh, hs, t_max, pos);
            let (got, want, cache_ok) = attention_case(&gpu, dtype, shape, bloom, cursor);
            let r = rel(&got, &want);
            assert!(r < tol, "{what}: rel {r}");
            assert!(cache_ok, "{what}: the new key and value in the cache");
        }
    }
}

/// One case of the test above: (the kernel's output, the composed one, whether the cache holds
/// the new key and value at `pos`), both (B, 1, nh·hs).
fn attention_case(
    gpu: &Device,
    dtype: DType,
    (b, nh, hs, t_max, pos): (usize, usize, usize, usize, usize),
    bloom: bool,
    cursor: bool,
) -> (Tensor, Tensor, bool) {
    let c = nh * hs;
    let qkv = randn(&[b, 1, 3 * c], gpu).to_dtype(dtype).unwrap();
    let k = randn(&[b, nh, t_max, hs], gpu).to_dtype(dtype).unwrap();
    let v = randn(&[b, nh, t_max, hs], gpu).to_dtype(dtype).unwrap();
    let (mask, kpos) = padded_rows(gpu, b, t_max, pos);
    let slopes: Vec<f32> = (0..nh).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
    let slopes = Tensor::from_vec(slopes, nh, gpu).unwrap();
    let layout = qkv_layout(bloom, hs, c);
    // q, the new k and v, (B, nh, 1, hs) each, from the layout.
    let part = |i: usize| -> Tensor {
        let x = match bloom {
            true => qkv
                .reshape((b, nh, 3, hs))
                .unwrap()
                .narrow(2, i, 1)
                .unwrap(),
            false => qkv
                .reshape((b, 3, nh, hs))
                .unwrap()
                .narrow(1, i, 1)
                .unwrap()
                .transpose(1, 2)
                .unwrap(),
        };
        x.reshape((b, nh, 1, hs)).unwrap().contiguous().unwrap()
    };
    let (q, k_new, v_new) = (part(0), part(1), part(2));
    let with_new = |cache: &Tensor, new: &Tensor| {
        let before = cache.narrow(2, 0, pos).unwrap();
        Tensor::cat(&[&before, new], 2).unwrap() // (B, nh, pos + 1, hs)
    };
    let (keys, values) = (with_new(&k, &k_new), with_new(&v, &v_new));
    let at = Tensor::new(&[pos as u32 + 1], gpu).unwrap(); // positions written after this step
    let slot = CacheSlot {
        k: &k,
        v: &v,
        key_mask: &mask,
        key_pos: &kpos,
        pos,
        cursor: cursor.then_some(&at),
    };
    let scale = 1. / (hs as f64).sqrt();
    let got = decode_attention(
        &qkv,
        layout,
        (nh, hs),
        &slot,
        bloom.then_some(&slopes),
        scale,
    )
    .unwrap()
    .expect("applies");
    let alibi = bloom.then_some((&kpos, &slopes));
    let want = composed_attention(&q, &keys, &values, &mask, alibi, scale); // (B, nh, 1, hs)
    let want = want.reshape((b, 1, c)).unwrap();
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let at_pos = |cache: &Tensor| f(&cache.narrow(2, pos, 1).unwrap());
    let cache_ok = rel(&at_pos(&k), &f(&k_new)) == 0. && rel(&at_pos(&v), &f(&v_new)) == 0.;
    (got, want, cache_ok)
}

/// (B, T_max) f32 key mask and key positions: row r's first r·3 keys (at most `pos`) are
/// padding; positions count the real ones.
fn padded_rows(gpu: &Device, b: usize, t_max: usize, pos: usize) -> (Tensor, Tensor) {
    let mut mask = vec![1f32; b * t_max];
    let mut kpos = vec![0f32; b * t_max];
    for r in 0..b {
        let pad = (r * 3).min(pos);
        for t in 0..t_max {
            mask[r * t_max + t] = if t < pad { 0. } else { 1. };
            kpos[r * t_max + t] = t.saturating_sub(pad) as f32;
        }
    }
    let mask = Tensor::from_vec(mask, (b, t_max), gpu).unwrap();
    (mask, Tensor::from_vec(kpos, (b, t_max), gpu).unwrap())
}

/// softmax(q·kᵀ · scale + padding (+ ALiBi: key positions × slopes)) · v over the Tk keys:
/// q (B, nh, 1, hs), keys and values (B, nh, Tk, hs), mask (B, ≥ Tk); scores round through
/// the dtype as the composed q·kᵀ, the rest in f32. (B, nh, 1, hs) f32.
fn composed_attention(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    alibi: Option<(&Tensor, &Tensor)>,
    scale: f64,
) -> Tensor {
    let (b, nh, tk, _) = keys.dims4().unwrap();
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let per_key = |t: &Tensor| t.narrow(1, 0, tk).unwrap().reshape((b, 1, 1, tk)).unwrap();
    let scores = q.matmul(&keys.t().unwrap()).unwrap(); // (B, nh, 1, Tk)
    let padding = ((per_key(mask) - 1.).unwrap() * 1e9).unwrap();
    let mut scores = (f(&scores) * scale)
        .unwrap()
        .broadcast_add(&padding)
        .unwrap();
    if let Some((kpos, slopes)) = alibi {
        let slopes = slopes.reshape((1, nh, 1, 1)).unwrap();
        let bias = per_key(kpos).broadcast_mul(&slopes).unwrap();
        scores = scores.broadcast_add(&bias).unwrap();
    }
    let p = candle_nn::ops::softmax_last_dim(&scores).unwrap();
    p.matmul(&f(values)).unwrap()
}
