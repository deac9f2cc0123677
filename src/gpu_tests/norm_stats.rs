//! A folded norm's statistics summed by the GEMV before it (`--fused norm-stats`): the sums
//! the residual GEMV leaves in the slots, the folded GEMV reading them against the norm then
//! the projection, and the slots it zeroes.

use super::*;
use crate::models::norm_fold::{fold, Folded};

/// (Σ y, Σ y²) over the slots (each the first two f64 of its line), in f64.
fn slot_sums(slots: &Tensor) -> [f64; 2] {
    let v = slots
        .narrow(1, 0, 2)
        .unwrap()
        .sum(0)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    [v[0], v[1]]
}

/// Whether every f64 of the slots' lines is 0, the padding included.
fn zeroed(slots: &Tensor) -> bool {
    slots
        .abs()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
        == 0.
}

/// (Σ y, Σ y²) of the one row `y` (1, n) as stored, in f64.
fn row_sums(y: &Tensor) -> [f64; 2] {
    let v = y
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    [v.iter().sum(), v.iter().map(|a| a * a).sum()]
}

fn slots(fill: f64, dev: &Device) -> Tensor {
    (Tensor::ones((NORM_SLOTS, NORM_LINE), DType::F64, dev).unwrap() * fill).unwrap()
}

/// The one-row residual GEMV with slots writes the same bits as without, and leaves in them
/// its output's sum and sum of squares (the f64 adds in any order: equal to 1e-12), the lines'
/// padding untouched; a second launch adds to them. More rows are not its (the slots hold
/// one). bf16 and f16, BLOOM's and GPT-2's decode shapes.
#[test]
fn gemv_add_sums_its_output_into_the_slots() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(1024, 1024), (4096, 4096), (3072, 768), (64, 40)] {
        for dtype in [DType::BF16, DType::F16] {
            let why = format!("{k} -> {n} {dtype:?}");
            let cast = |t: Tensor| t.to_dtype(dtype).unwrap();
            let w = cast((randn(&[n, k], &dev) * 0.05).unwrap());
            let b = cast(randn(&[n], &dev));
            let x = cast(randn(&[1, k], &dev));
            let r = cast(((randn(&[1, n], &dev) * 3.).unwrap() + 0.5).unwrap());
            let stats = slots(0., &dev);
            let got = gemv_add(&x, &w, &b, &r, Some(&stats)).unwrap().expect(&why);
            let plain = gemv_add(&x, &w, &b, &r, None).unwrap().expect(&why);
            assert_eq!(max_abs_diff(&got, &plain), 0., "{why}");
            let (s, want) = (slot_sums(&stats), row_sums(&got));
            for j in 0..2 {
                let d = (s[j] - want[j]).abs() / want[j].abs().max(1.);
                assert!(d < 1e-12, "{why}: sum {j} {} against {}", s[j], want[j]);
            }
            assert!(
                zeroed(&stats.narrow(1, 2, NORM_LINE - 2).unwrap()),
                "{why}: padding"
            );
            gemv_add(&x, &w, &b, &r, Some(&stats)).unwrap().expect(&why);
            let d = (slot_sums(&stats)[1] - 2. * want[1]).abs();
            assert!(d < 1e-9 * want[1], "{why}: a second launch adds");
            let (x2, r2) = (x.repeat((2, 1)).unwrap(), r.repeat((2, 1)).unwrap());
            let two = gemv_add(&x2, &w, &b, &r2, Some(&stats)).unwrap();
            assert!(two.is_none(), "{why}: two rows took the slots");
        }
    }
}

/// The folded GEMV reading a residual GEMV's slots gives act(LN(x) Wᵀ + b) as the one that
/// sums the statistics itself (within about a rounding of the largest output: the statistics
/// differ in f32's last bits), and zeroes the slots it is given to clear, not those it reads;
/// without slots to read, its output is the summing GEMV's bit for bit. bf16 and f16, one row
/// off zero mean, BLOOM's and GPT-2's widths.
#[test]
fn gemv_ln_reads_the_slots_and_clears_the_norm_before() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(768, 2304), (1024, 4096), (4096, 12288), (64, 40)] {
        for dtype in [DType::BF16, DType::F16] {
            let cast = |t: Tensor| t.to_dtype(dtype).unwrap();
            let w = cast((randn(&[n, k], &dev) * 0.05).unwrap());
            let b = cast(randn(&[n], &dev));
            let gamma = cast(((randn(&[k], &dev) * 0.3).unwrap() + 1.).unwrap());
            let beta = cast((randn(&[k], &dev) * 0.3).unwrap());
            let folded = fold(&w, &b, &gamma, &beta).unwrap();
            // The residual stream x (m, k) written by a residual GEMV that fills the slots.
            let (pw, pb) = (
                cast((randn(&[k, k], &dev) * 0.05).unwrap()),
                cast(randn(&[k], &dev)),
            );
            let why = format!("{k} -> {n} {dtype:?}");
            let (h, r) = (
                cast(randn(&[1, k], &dev)),
                cast(((randn(&[1, k], &dev) * 2.).unwrap() + 0.7).unwrap()),
            );
            let stats = slots(0., &dev);
            let x = gemv_add(&h, &pw, &pb, &r, Some(&stats))
                .unwrap()
                .expect(&why);
            check_ln_from_slots(&x, &folded, &stats, &why);
        }
    }
    // Slots of another shape are not the kernel's.
    let x = randn(&[1, 64], &dev).to_dtype(DType::BF16).unwrap();
    let w = randn(&[40, 64], &dev).to_dtype(DType::BF16).unwrap();
    let sb = Tensor::zeros((40, 2), DType::F32, &dev).unwrap();
    let short = Tensor::zeros((NORM_SLOTS - 1, NORM_LINE), DType::F64, &dev).unwrap();
    let summed = Summed {
        stats: Some(&short),
        clear: &short,
    };
    assert!(gemv_ln(&x, &w, &sb, Act::None, 1e-5, Some(summed))
        .unwrap()
        .is_none());
}

/// The folded GEMV of x from `stats` against the one summing its own statistics, and the
/// slots it clears (see the test above).
fn check_ln_from_slots(x: &Tensor, folded: &Folded, stats: &Tensor, why: &str) {
    let (dev, eps) = (x.device(), 1e-5);
    let before = stats.to_vec2::<f64>().unwrap();
    for act in [Act::None, Act::GeluTanh] {
        let clear = slots(1., dev);
        let summed = Summed {
            stats: Some(stats),
            clear: &clear,
        };
        let got = gemv_ln(x, &folded.w, &folded.sb, act, eps, Some(summed));
        let got = got.unwrap().expect(why);
        // The summing GEMV's own kernel: at one row `gemv-wide` takes a norm without slots,
        // in another order of sums.
        set_enabled(&all_but(Fused::GemvWide));
        let own = gemv_ln(x, &folded.w, &folded.sb, act, eps, None);
        set_enabled(&[Fused::All]);
        let own = own.unwrap().expect(why);
        let r = rel(&got, &own);
        assert!(
            r < 1e-2,
            "{why} {act:?}: rel {r} to the GEMV summing its own"
        );
        let cleared = clear.narrow(1, 0, 2).unwrap();
        assert!(zeroed(&cleared), "{why}: the slots to clear");
        assert_eq!(
            stats.to_vec2::<f64>().unwrap(),
            before,
            "{why}: the slots read"
        );
        // Nothing to read (block 0's qkv): the summing GEMV, still clearing.
        let clear = slots(1., dev);
        let summed = Summed {
            stats: None,
            clear: &clear,
        };
        let got = gemv_ln(x, &folded.w, &folded.sb, act, eps, Some(summed));
        assert_eq!(max_abs_diff(&got.unwrap().expect(why), &own), 0., "{why}");
        let cleared = clear.narrow(1, 0, 2).unwrap();
        assert!(zeroed(&cleared), "{why}: cleared without slots to read");
    }
}

/// Greedy generation of one row, 12 new tokens, bf16, by the tiny models with rows over 2 KB:
/// graph replays (every path: the folded GEMVs reading summed statistics, each step zeroing
/// the slots the next one adds into, with programmatic edges) pick the same ids as eager steps
/// of the same kernels (every path but graph), which the logits test holds against the norms;
/// after either, every slot is zero but the last block's MLP norm's (the next step's block 0
/// clears it).
#[test]
fn graphed_steps_with_summed_statistics_pick_the_eager_ids() {
    use crate::models::generate::{generate_in, left_pad, Greedy};
    use std::sync::atomic::Ordering::Relaxed;
    let (gpu, _one_at_a_time) = gpu();
    let g = Greedy {
        new_tokens: 12,
        banned: vec![],
    };
    let prompts = left_pad(&[vec![3, 10, 17, 24, 31]], 0, &gpu).unwrap();
    let eager: Vec<Fused> = all_but(Fused::Graph)
        .into_iter()
        .filter(|&f| f != Fused::Step)
        .collect();
    for spec in super::norm_fold::specs() {
        if !super::norm_fold::long_rows(&spec) {
            continue;
        }
        let mut ids = Vec::new();
        for (graphed, paths) in [(false, eager.clone()), (true, vec![Fused::All])] {
            set_enabled(&paths);
            let mut model = spec
                .load(&WeightSource::Random { seed: 0 }, DType::BF16, &gpu)
                .unwrap();
            model.prepare_decode().unwrap();
            model.fold_norms(1).unwrap();
            let (replayed, summed) = (replays(), SUMMED_LAUNCHES.load(Relaxed));
            let mut cache = model.new_cache(1, prompts.len() + 12).unwrap();
            let hook = &mut |_| Ok(());
            ids.push(generate_in(model.as_ref(), &mut cache, &prompts, &g, hook).unwrap());
            let why = format!("{}, graph {graphed}", spec.name);
            assert_eq!(replays() - replayed > 0, graphed, "{why}: replays");
            // The count is the last captured graph's: the eager arm captures none.
            assert!(
                !graphed || programmatic_edges() > 0,
                "{why}: programmatic edges"
            );
            let summed = SUMMED_LAUNCHES.load(Relaxed) - summed;
            assert!(summed > 0, "{why}: summed statistics");
            let slots = cache.norm_stats().expect(&why);
            let per_norm = slots
                .abs()
                .unwrap()
                .sum((1, 2))
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let held: Vec<usize> = (0..per_norm.len()).filter(|&j| per_norm[j] != 0.).collect();
            assert_eq!(
                held,
                [per_norm.len() - 1],
                "{why}: slots left after the steps"
            );
        }
        set_enabled(&[Fused::All]);
        assert_eq!(ids[1], ids[0], "{}", spec.name);
        assert_eq!(ids[1][0].len(), 12);
    }
}
