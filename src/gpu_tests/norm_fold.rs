//! The LayerNorms folded into the decode GEMVs (`--fused norm-fold`) and, at 5–16 rows, the
//! tensor-core projections (`--fused skinny-fold`): the kernel that normalises its input
//! against the norm then the projection in f32, the kernel that adds the residual against the
//! projection then the add kernel bit for bit, and decoding taking the folded kernels.

use super::*;
use crate::models::norm_fold::{fold, MAX_ROW_BYTES};

/// The folded projection `folded_kernel` (None: it did not apply) against act(LN(x) Wᵀ + b)
/// in f32 from the same (rounded) x, W, b, γ and β, for x `rows` rows off zero mean and unit
/// scale, as a residual stream is; W, b, γ, β around BLOOM's and GPT-2's shapes; bf16 and
/// f16, no activation and tanh-GELU.
fn check_folded_kernel(
    rows: &[usize],
    folded_kernel: impl Fn(&Tensor, &crate::models::norm_fold::Folded, Act, f64) -> Option<Tensor>,
) {
    let (dev, _one_at_a_time) = gpu();
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let eps = 1e-5;
    for (k, n) in [(768, 2304), (1024, 4096), (4096, 1024), (64, 40)] {
        for dtype in [DType::BF16, DType::F16] {
            let cast = |t: Tensor| t.to_dtype(dtype).unwrap();
            let w = cast((randn(&[n, k], &dev) * 0.05).unwrap());
            let b = cast(randn(&[n], &dev));
            let gamma = cast(((randn(&[k], &dev) * 0.3).unwrap() + 1.).unwrap());
            let beta = cast((randn(&[k], &dev) * 0.3).unwrap());
            let folded = fold(&w, &b, &gamma, &beta).unwrap();
            for &m in rows {
                let x = cast(((randn(&[m, k], &dev) * 2.).unwrap() + 0.7).unwrap());
                let mean = f(&x).mean_keepdim(1).unwrap();
                let centred = f(&x).broadcast_sub(&mean).unwrap();
                let var = centred.sqr().unwrap().mean_keepdim(1).unwrap();
                let normed = centred
                    .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
                    .unwrap();
                let normed = normed.broadcast_mul(&f(&gamma)).unwrap();
                let normed = normed.broadcast_add(&f(&beta)).unwrap();
                let y = normed.matmul(&f(&w).t().unwrap()).unwrap();
                let y = y.broadcast_add(&f(&b)).unwrap();
                for act in [Act::None, Act::GeluTanh] {
                    let why = format!("{m}x{k} -> {n} {dtype:?} {act:?}");
                    let got = folded_kernel(&x, &folded, act, eps).expect(&why);
                    assert_eq!(got.dims(), [m, n], "{why}");
                    let r = rel(&got, &act_ref(&y, act));
                    assert!(r < 1e-2, "{why}: rel {r}");
                }
            }
        }
    }
}

/// The folded GEMV (1–4 rows) against the norm then the projection, at one row with K ≤ 1024
/// the wide kernel (`gemv-wide`) and only there; five rows and an sb of another shape are not
/// its.
#[test]
fn gemv_ln_matches_the_norm_then_the_projection() {
    use std::sync::atomic::Ordering::Relaxed;
    check_folded_kernel(&[1, 2, 3, 4], |x, f, act, eps| {
        let wide = WIDE_LAUNCHES.load(Relaxed);
        let y = gemv_ln(x, &f.w, &f.sb, act, eps, None).unwrap();
        let (m, k) = x.dims2().unwrap();
        let want_wide = m == 1 && k <= 1024;
        let launched = WIDE_LAUNCHES.load(Relaxed) - wide;
        assert_eq!(launched, usize::from(want_wide), "{m}x{k}: wide");
        y
    });
    let (dev, _one_at_a_time) = gpu();
    let eps = 1e-5;
    // Five rows are not the GEMV's; nor an sb of another shape.
    let x = randn(&[5, 64], &dev).to_dtype(DType::BF16).unwrap();
    let w = randn(&[40, 64], &dev).to_dtype(DType::BF16).unwrap();
    let sb = Tensor::zeros((40, 2), DType::F32, &dev).unwrap();
    assert!(gemv_ln(&x, &w, &sb, Act::None, eps, None)
        .unwrap()
        .is_none());
    let x = x.narrow(0, 0, 1).unwrap();
    let short = sb.narrow(0, 0, 39).unwrap();
    assert!(gemv_ln(&x, &w, &short, Act::None, eps, None)
        .unwrap()
        .is_none());
}

/// The GEMV with the residual add in its epilogue holds, bit for bit, the add kernel's sum of
/// the GEMV's output and the residual (the branch rounded before the add, as it was): bf16 and
/// f16, 1–4 rows, BLOOM's and GPT-2's decode shapes.
#[test]
fn gemv_add_is_the_gemv_then_the_add_bit_for_bit() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(1024, 1024), (4096, 1024), (3072, 768), (64, 40)] {
        for dtype in [DType::BF16, DType::F16] {
            let cast = |t: Tensor| t.to_dtype(dtype).unwrap();
            let w = cast((randn(&[n, k], &dev) * 0.05).unwrap());
            let b = cast(randn(&[n], &dev));
            let (ones, zeros) = (
                cast(Tensor::ones(n, DType::F32, &dev).unwrap()),
                cast(Tensor::zeros(n, DType::F32, &dev).unwrap()),
            );
            for m in 1..=4 {
                let why = format!("{m}x{k} -> {n} {dtype:?}");
                let x = cast(randn(&[m, k], &dev));
                let r = cast((randn(&[m, n], &dev) * 3.).unwrap());
                let got = gemv_add(&x, &w, &b, &r, None).unwrap().expect(&why);
                let y = gemv(&x, &w, &b, Act::None).unwrap().expect(&why);
                let (sum, _) = add_layer_norm(&y, &r, &ones, &zeros, 1e-5)
                    .unwrap()
                    .expect(&why);
                assert_eq!(max_abs_diff(&got, &sum), 0., "{why}");
            }
        }
    }
}

/// The tensor-core projection with the norm folded (`skinny-fold`, 5–16 rows) against the norm
/// then the projection; 17 rows, an sb of another shape and the path off are not its.
#[test]
fn skinny_ln_matches_the_norm_then_the_projection() {
    check_folded_kernel(&[5, 9, 16], |x, f, act, eps| {
        skinny_ln(x, &f.w, &f.sb, act, eps).unwrap()
    });
    let (dev, _one_at_a_time) = gpu();
    let bf = |dims: &[usize]| randn(dims, &dev).to_dtype(DType::BF16).unwrap();
    let (w, sb) = (
        bf(&[40, 64]),
        Tensor::zeros((40, 2), DType::F32, &dev).unwrap(),
    );
    let ln = |x: &Tensor, sb: &Tensor| skinny_ln(x, &w, sb, Act::None, 1e-5).unwrap();
    assert!(ln(&bf(&[17, 64]), &sb).is_none());
    assert!(ln(&bf(&[16, 64]), &sb.narrow(0, 0, 39).unwrap()).is_none());
    set_enabled(&all_but(Fused::SkinnyFold));
    assert!(ln(&bf(&[16, 64]), &sb).is_none());
    set_enabled(&[Fused::All]);
}

/// The tensor-core projection with the residual add in its epilogue (`skinny-fold`) holds, bit
/// for bit, the add kernel's sum of the projection's output and the residual: bf16 and f16,
/// 5–16 rows, BLOOM's and GPT-2's decode shapes; a residual of another shape is not its.
#[test]
fn skinny_add_is_the_projection_then_the_add_bit_for_bit() {
    let (dev, _one_at_a_time) = gpu();
    for (k, n) in [(1024, 1024), (4096, 1024), (3072, 768), (64, 40)] {
        for dtype in [DType::BF16, DType::F16] {
            let cast = |t: Tensor| t.to_dtype(dtype).unwrap();
            let w = cast((randn(&[n, k], &dev) * 0.05).unwrap());
            let b = cast(randn(&[n], &dev));
            let (ones, zeros) = (
                cast(Tensor::ones(n, DType::F32, &dev).unwrap()),
                cast(Tensor::zeros(n, DType::F32, &dev).unwrap()),
            );
            for m in [5, 16] {
                let why = format!("{m}x{k} -> {n} {dtype:?}");
                let x = cast(randn(&[m, k], &dev));
                let r = cast((randn(&[m, n], &dev) * 3.).unwrap());
                let got = skinny_add(&x, &w, &b, &r).unwrap().expect(&why);
                let y = skinny_linear(&x, &w, &b, Act::None).unwrap().expect(&why);
                let (sum, _) = add_layer_norm(&y, &r, &ones, &zeros, 1e-5)
                    .unwrap()
                    .expect(&why);
                assert_eq!(max_abs_diff(&got, &sum), 0., "{why}");
                let short = r.narrow(1, 0, n - 1).unwrap().contiguous().unwrap();
                assert!(skinny_add(&x, &w, &b, &short).unwrap().is_none(), "{why}");
            }
        }
    }
}

/// The tiny presets, and the same two with rows of the residual stream over
/// [`MAX_ROW_BYTES`] in bf16 (1152 and 1280 channels, head size 128), which fold only with
/// `norm-stats`.
pub(super) fn specs() -> Vec<ModelSpec> {
    use crate::models::Architecture;
    let (mut gpt2, mut bloom) = (
        crate::models::gpt2::Config::gpt2_tiny(),
        crate::models::bloom::Config::bloom_tiny(),
    );
    (gpt2.n_embd, gpt2.n_head) = (1152, 9);
    (bloom.hidden_size, bloom.n_head) = (1280, 10);
    let mut specs: Vec<ModelSpec> = ["gpt2-tiny", "bloom-tiny"]
        .iter()
        .map(|n| ModelSpec::preset(n).unwrap())
        .collect();
    specs.push(ModelSpec {
        name: "gpt2-tiny-1152".into(),
        arch: Architecture::Gpt2(gpt2),
    });
    specs.push(ModelSpec {
        name: "bloom-tiny-1280".into(),
        arch: Architecture::Bloom(bloom),
    });
    specs
}

/// Whether `spec`'s rows of the residual stream in bf16 are longer than [`MAX_ROW_BYTES`].
pub(super) fn long_rows(spec: &ModelSpec) -> bool {
    use crate::models::Architecture;
    let hidden = match &spec.arch {
        Architecture::Gpt2(c) => c.n_embd,
        Architecture::Bloom(c) => c.hidden_size,
    };
    2 * hidden > MAX_ROW_BYTES
}

/// `spec`'s blocks.
pub(super) fn n_layer(spec: &ModelSpec) -> usize {
    use crate::models::Architecture;
    match &spec.arch {
        Architecture::Gpt2(c) => c.n_layer,
        Architecture::Bloom(c) => c.n_layer,
    }
}

/// Decode steps of the tiny models in bf16 take the folded GEMV with the path on at one row
/// (rows over 2 KB with norm-stats only, reading summed statistics) and the folded tensor-core
/// projection at 16 rows with skinny-fold (where it takes the MLP's weight: not the 1152- and
/// 1280-channel models'), and neither with the paths off nor at three rows
/// (norm_fold::folds); their logits are within bf16 rounding of the steps with the norms.
/// Random weights hold γ = 1 and β = 0: the next test folds norms of random weight and bias.
#[test]
fn decoding_takes_the_folded_kernels_only_with_the_paths_on() {
    let (gpu, _one_at_a_time) = gpu();
    let src = WeightSource::Random { seed: 0 };
    for spec in specs() {
        for rows in [1, 3, 16] {
            let want = rows == 1 || (rows == 16 && !long_rows(&spec));
            check_folded_against_normed(&gpu, &spec, &src, rows, want);
        }
    }
}

/// One-row decoding with the norms folded, on checkpoints whose LayerNorms have random weights
/// (1 ± 0.3) and biases (± 0.3), every norm of the tiny models (GPT-2's ln_1, ln_2, ln_f;
/// BLOOM's input, post-attention, embedding and final norms), rows over 2 KB (summed
/// statistics) too: the logits of the folded steps within bf16 rounding of the steps with the
/// norms, through the same safetensors loader as a real checkpoint.
#[test]
fn folded_decoding_with_random_norms_matches_the_norms() {
    use crate::models::weights::save_checkpoint;
    use crate::models::Recorder;
    let (gpu, _one_at_a_time) = gpu();
    for spec in specs() {
        let name = &spec.name;
        let record = Recorder::default();
        let random = WeightSource::Random { seed: 3 };
        let hidden = indicatif::ProgressBar::hidden();
        spec.load_watched(
            &random,
            DType::F32,
            &Device::Cpu,
            Some(record.clone()),
            &hidden,
        )
        .unwrap();
        let mut norms = 0;
        let tensors: Vec<(String, Tensor)> = std::mem::take(&mut *record.lock().unwrap())
            .into_iter()
            .map(|(n, t)| {
                let norm = n.contains("ln_") || n.contains("layernorm");
                norms += norm as usize;
                let t = match (norm, n.ends_with(".weight")) {
                    (true, true) => t.randn_like(1., 0.3).unwrap(),
                    (true, false) => t.randn_like(0., 0.3).unwrap(),
                    _ => t,
                };
                (n, t)
            })
            .collect();
        assert!(norms >= 8, "{name}: {norms} norm tensors");
        let dir = tempfile::tempdir().unwrap();
        save_checkpoint(dir.path(), &spec.hf_config(DType::F32), tensors).unwrap();
        let src = WeightSource::Dir(dir.path().to_path_buf());
        check_folded_against_normed(&gpu, &spec, &src, 1, true);
    }
}

/// Decodes `rows` rows of `spec` from `src` with every path, every path but norm-stats, every
/// path but norm-fold and every path but skinny-fold: the folded kernels launched iff `folds`,
/// with the first arm (reading summed statistics iff the rows are over 2 KB), the second (rows
/// up to 2 KB) and the fourth (one row); the logits of each folded arm within bf16 rounding of
/// the norms' (four steps: slots not zeroed between steps would show).
fn check_folded_against_normed(
    gpu: &Device,
    spec: &ModelSpec,
    src: &WeightSource,
    rows: usize,
    folds: bool,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let (name, long) = (&spec.name, long_rows(spec));
    let mut logits = Vec::new();
    let arms = [
        vec![Fused::All],
        all_but(Fused::NormStats),
        all_but(Fused::NormFold),
        all_but(Fused::SkinnyFold),
    ];
    let launches = || LN_LAUNCHES.load(Relaxed) + SKINNY_LN_LAUNCHES.load(Relaxed);
    let skinny = || [&SKINNY_LN_LAUNCHES, &SKINNY_ADD_LAUNCHES].map(|c| c.load(Relaxed));
    for (arm, paths) in arms.into_iter().enumerate() {
        let paths: Vec<Fused> = paths.into_iter().filter(|&f| f != Fused::Step).collect();
        set_enabled(&paths);
        let (ln, summed, skinny_before) = (launches(), SUMMED_LAUNCHES.load(Relaxed), skinny());
        logits.push(decode_logits(gpu, spec, src, rows));
        let [lns, adds] = [0, 1].map(|j| skinny()[j] - skinny_before[j]);
        // Each folded tensor-core projection's block adds its residual in the next one's.
        assert_eq!(adds, lns, "{name}, {rows} rows, arm {arm}: residual adds");
        let ln = launches() - ln;
        let summed = SUMMED_LAUNCHES.load(Relaxed) - summed;
        let why = format!("{name}, {rows} rows, arm {arm}: {ln} folded, {summed} summed");
        // Three folded steps, and the prefill where its rows (one row's five tokens) are the
        // tensor-core kernel's and it takes the weights (not over 2 KB rows): two folded
        // projections a block, all but block 0's qkv reading summed statistics at one row
        // over 2 KB.
        let blocks = n_layer(spec);
        let folded = match arm {
            0 => folds,
            1 => folds && !long,
            3 => folds && rows == 1,
            _ => false,
        };
        let prefill_rows = rows * prompt_lens(rows).max().unwrap_or(0);
        let prefill = arm != 3 && !long && (5..=16).contains(&prefill_rows);
        let steps = 3 + usize::from(prefill);
        assert_eq!(ln, if folded { steps * 2 * blocks } else { 0 }, "{why}");
        let reads = folds && (arm == 0 || arm == 3) && long;
        assert_eq!(
            summed,
            if reads { 3 * (2 * blocks - 1) } else { 0 },
            "{why}"
        );
    }
    for arm in [0, 1, 3] {
        for (i, (folded, normed)) in logits[arm].iter().zip(&logits[2]).enumerate() {
            let r = rel(folded, normed);
            assert!(
                r < 3e-2,
                "{name}, {rows} rows, arm {arm}, step {i}: rel {r}"
            );
        }
    }
}

/// The prompts' lengths of [`decode_logits`]' `rows` rows.
fn prompt_lens(rows: usize) -> impl Iterator<Item = usize> {
    (0..rows).map(|r| 5 + 3 * r)
}

/// The logits of a cached prefill of `rows` prompts and three decode steps, bf16, the weights
/// laid out for decoding and the norms folded as the engine does, with the `--fused` paths
/// already set.
fn decode_logits(gpu: &Device, spec: &ModelSpec, src: &WeightSource, rows: usize) -> Vec<Tensor> {
    use crate::models::generate::left_pad;
    let prompts: Vec<Vec<u32>> = prompt_lens(rows)
        .map(|n| (0..n as u32).map(|t| 1 + 7 * t).collect())
        .collect();
    let prompts = left_pad(&prompts, 0, gpu).unwrap();
    let mut model = spec.load(src, DType::BF16, gpu).unwrap();
    model.prepare_decode().unwrap();
    model.fold_norms(rows).unwrap();
    let mut cache = model.new_cache(rows, prompts.len() + 4).unwrap();
    let mut logits = vec![model
        .forward_cached(&prompts.ids, &prompts.mask, &mut cache)
        .unwrap()];
    let real = Tensor::ones((rows, 1), DType::U32, gpu).unwrap();
    for id in [11u32, 12, 13] {
        let next = Tensor::from_vec(vec![id; rows], (rows, 1), gpu).unwrap();
        logits.push(model.forward_cached(&next, &real, &mut cache).unwrap());
    }
    logits
}
