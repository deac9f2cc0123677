//! A graphed decode step's first and last kernels (`--fused step-io`): the embedding rows in
//! one kernel, the greedy pick written into the step's input and the token record.

use super::*;

/// The embedding rows: gpt2's token + position sum equal to candle's gathers and add, BLOOM's
/// gather and LayerNorm to candle's gather and norm (f32 within rounding, bf16 within its
/// ulps), at hidden sizes 768 and the widest row the kernel holds (4096 bf16, 2048 f32: four
/// vectors a thread), three rows; wider rows and ids past the vocabulary (zero rows) too.
#[test]
fn embed_rows_match_the_gathers_then_the_add_or_the_norm() {
    let (gpu, _one_at_a_time) = gpu();
    let cases = [(DType::F32, 1e-6, 2048), (DType::BF16, 8e-3, 4096)];
    for (dtype, tol, widest) in cases {
        let wider = randn(&[50, 2 * widest], &gpu).to_dtype(dtype).unwrap();
        let ids = Tensor::new(&[[7u32]], &gpu).unwrap();
        assert!(
            embed_rows(&wider, &ids, None, None).unwrap().is_none(),
            "{dtype:?} wider"
        );
        for c in [768, widest] {
            let wte = randn(&[50, c], &gpu).to_dtype(dtype).unwrap();
            let wpe = randn(&[40, c], &gpu).to_dtype(dtype).unwrap();
            let ids = Tensor::new(&[[7u32], [49], [0]], &gpu).unwrap(); // (B, 1)
            let positions = Tensor::new(&[[5f32], [17.], [39.]], &gpu).unwrap();
            let flat = ids.flatten_all().unwrap();
            let tok = wte.index_select(&flat, 0).unwrap();
            let pos = wpe
                .index_select(
                    &positions
                        .flatten_all()
                        .unwrap()
                        .to_dtype(DType::U32)
                        .unwrap(),
                    0,
                )
                .unwrap();
            let got = embed_rows(&wte, &ids, Some((&wpe, &positions)), None)
                .unwrap()
                .expect("applies");
            let want = (tok.to_dtype(DType::F32).unwrap() + pos.to_dtype(DType::F32).unwrap())
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            assert_eq!(max_abs_diff(&got, &want), 0.0, "{dtype:?} C {c}: the sum");
            let (w, b) = (
                randn(&[c], &gpu)
                    .affine(0.5, 1.)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
                randn(&[c], &gpu).to_dtype(dtype).unwrap(),
            );
            let got = embed_rows(&wte, &ids, None, Some((&w, &b, 1e-5)))
                .unwrap()
                .expect("applies");
            let x = tok.to_dtype(DType::F32).unwrap();
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let want = candle_nn::ops::layer_norm_slow(&x, &f(&w), &f(&b), 1e-5).unwrap();
            let r = rel(&got, &want);
            assert!(r < tol, "{dtype:?} C {c}: the norm, rel {r}");
        }
    }
    // An id past the vocabulary: a zero row.
    let wte = randn(&[50, 768], &gpu);
    let ids = Tensor::new(&[[50u32]], &gpu).unwrap();
    let got = embed_rows(&wte, &ids, None, None)
        .unwrap()
        .expect("applies");
    assert_eq!(
        got.abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0
    );
}

/// The pick written in place: the ids `argmax` gives, in the step's ids buffer and in the
/// record's column `*cursor − base` and nowhere else, for a one-block row (V 1000) and the
/// chunked ones (50257, 250880: the last chunk of a row picks, its counter left at zero),
/// with and without a ban.
#[test]
fn argmax_into_writes_the_ids_and_their_record_column() {
    let (gpu, _one_at_a_time) = gpu();
    for v in [1000, 50257, 250880] {
        let x = randn(&[3, v], &gpu).to_dtype(DType::BF16).unwrap();
        let mut ban = vec![0f32; v];
        ban[v / 2] = f32::NEG_INFINITY;
        let ban = Tensor::from_vec(ban, (1, v), &gpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        for ban in [None, Some(&ban)] {
            let want = argmax(&x, ban).unwrap().expect("applies"); // (3, 1)
            let ids = Tensor::zeros((3, 1), DType::U32, &gpu).unwrap();
            let tokens = Tensor::zeros((3, 5), DType::U32, &gpu).unwrap();
            let cursor = Tensor::new(&[12u32], &gpu).unwrap(); // base 10: column 2
            let counters = Tensor::zeros(3, DType::U32, &gpu).unwrap();
            let record = Record {
                tokens: &tokens,
                cursor: &cursor,
                base: 10,
                counters: &counters,
            };
            assert!(argmax_into(&x, ban, &ids, Some(record)).unwrap());
            assert_eq!(
                counters.to_vec1::<u32>().unwrap(),
                [0, 0, 0],
                "V {v}: counters"
            );
            let want = want.to_vec2::<u32>().unwrap();
            assert_eq!(ids.to_vec2::<u32>().unwrap(), want, "V {v}");
            for (row, got) in tokens.to_vec2::<u32>().unwrap().iter().enumerate() {
                assert_eq!(got, &[0, 0, want[row][0], 0, 0], "V {v} row {row}");
            }
        }
    }
    // A cursor past the record's columns writes the ids only.
    let x = randn(&[1, 1000], &gpu);
    let (ids, tokens) = (
        Tensor::zeros((1, 1), DType::U32, &gpu).unwrap(),
        Tensor::zeros((1, 3), DType::U32, &gpu).unwrap(),
    );
    let cursor = Tensor::new(&[20u32], &gpu).unwrap();
    let counters = Tensor::zeros(1, DType::U32, &gpu).unwrap();
    let record = Record {
        tokens: &tokens,
        cursor: &cursor,
        base: 10,
        counters: &counters,
    };
    assert!(argmax_into(&x, None, &ids, Some(record)).unwrap());
    assert_eq!(tokens.to_vec2::<u32>().unwrap(), [[0, 0, 0]]);
}

/// Graph-replayed generation gives the same ids with the step's own first and last kernels as
/// without them (greedy, 12 new tokens), for both models at their head size and at 64 / 128,
/// one row and three: gpt2 in bf16 (its one-row step takes the folded GEMVs, bf16 only; its
/// sum is the add's bits), BLOOM in f32 (its norm's sums run in another order than candle's);
/// with the path on, the steps took the embedding kernel (BLOOM's always, gpt2's at one row)
/// and recorded their picks.
#[test]
fn step_io_leaves_graph_replayed_ids_unchanged() {
    use crate::models::generate::{generate, left_pad, Greedy};
    use std::sync::atomic::Ordering;
    let (gpu, _one_at_a_time) = gpu();
    let g = Greedy {
        new_tokens: 12,
        banned: vec![],
    };
    let mut specs = vec![
        ModelSpec::preset("gpt2-tiny").unwrap(),
        ModelSpec::preset("bloom-tiny").unwrap(),
    ];
    specs.extend(super::decode::wide_head_specs());
    let rows: Vec<Vec<u32>> = (0..3)
        .map(|r| (0..3 + r).map(|t| 1 + 7 * t + r).collect())
        .collect();
    let without: Vec<Fused> = all_but(Fused::StepIo)
        .into_iter()
        .filter(|&f| f != Fused::Step)
        .collect();
    for (spec, n) in specs.iter().flat_map(|s| [1, 3].map(|n| (s, n))) {
        let prompts = left_pad(&rows[..n], 0, &gpu).unwrap();
        let mut ids = Vec::new();
        let gpt2 = matches!(spec.arch, crate::models::Architecture::Gpt2(_));
        let dtype = if gpt2 { DType::BF16 } else { DType::F32 };
        for (on, paths) in [(false, without.clone()), (true, vec![Fused::All])] {
            let counts = || {
                let load = |c: &std::sync::atomic::AtomicUsize| c.load(Ordering::Relaxed);
                (load(&EMBED_LAUNCHES), load(&RECORDED_PICKS))
            };
            let before = counts();
            set_enabled(&paths);
            let mut model = spec
                .load(&WeightSource::Random { seed: 0 }, dtype, &gpu)
                .unwrap();
            model.prepare_decode().unwrap();
            model.fold_norms(n).unwrap();
            let replayed = replays();
            ids.push(generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap());
            assert_eq!(replays() - replayed, 10, "{}, {n} rows: replays", spec.name);
            let after = counts();
            let (embedded, recorded) = (after.0 - before.0, after.1 - before.1);
            let why = format!("{}, {n} rows, step-io {on}", spec.name);
            assert_eq!(
                embedded > 0,
                on && (!gpt2 || n == 1),
                "{why}: embedding kernel"
            );
            assert_eq!(recorded > 0, on, "{why}: recorded picks");
        }
        set_enabled(&[Fused::All]);
        assert_eq!(ids[1], ids[0], "{}, {n} rows", spec.name);
        assert_eq!(ids[1][0].len(), 12);
    }
}
