//! fp8 weights (`--dtype fp8`): the GEMV and the tensor-core kernel reading E4M3 bytes and the
//! dequantization kernel against candle's cast of the same values, then whole models decoding
//! on them.

use super::*;
use crate::models::fp8::Fp8Weight;

/// The fp8 GEMV (1–4 rows) and the tensor-core kernel (5–16 rows), bias and tanh-GELU, against
/// the f32 product with the dequantized weight, in bf16 and f16, for BLOOM's and GPT-2's decode
/// shapes; one row of K ≥ 4096 takes the eight-warp kernel, over several steps a lane at
/// bloom-7b1's K = 16384, with a partial last block of columns (of 8 and of 32 at 5–16 rows);
/// with the GEMV off, the tensor-core kernel at 1–4 rows; the GEMV's `early-weights` kernels
/// bit for bit as the plain ones.
#[test]
fn fp8_gemv_matches_the_dequantized_projection() {
    let (dev, _one_at_a_time) = gpu();
    let shapes = [
        (1024, 3072),
        (4096, 1024),
        (16384, 4099),
        (768, 50257),
        (64, 40),
        (64, 4100),
        (1280, 1001),
    ];
    for (k, n) in shapes {
        let w = (randn(&[n, k], &dev) * 0.05).unwrap();
        let b = randn(&[n], &dev);
        let fp8 = Fp8Weight::quantize(&w, Some(&b)).unwrap();
        let wf = fp8.dequantize(DType::F32).unwrap();
        for rows in [1, 2, 3, 4, 5, 8, 12, 16] {
            for dtype in [DType::BF16, DType::F16] {
                for act in [Act::None, Act::GeluTanh] {
                    let x = randn(&[rows, k], &dev).to_dtype(dtype).unwrap();
                    let y = fp8.gemv(&x, act).unwrap().expect("an fp8 kernel applies");
                    let xf = x.to_dtype(DType::F32).unwrap();
                    let r = xf
                        .matmul(&wf.t().unwrap())
                        .unwrap()
                        .broadcast_add(&b)
                        .unwrap();
                    let why = format!("{rows}x{k} -> {n} {dtype:?} {act:?}");
                    assert_eq!((y.dims(), y.dtype()), (&[rows, n][..], dtype), "{why}");
                    let r = rel(&y, &act_ref(&r, act));
                    assert!(r < 1e-2, "{why}: rel {r}");
                    if rows <= FP8_GEMV_MAX_ROWS {
                        // The early kernels (weights before the wait) give the plain ones' bits.
                        set_enabled(&all_but(Fused::EarlyWeights));
                        let p = fp8.gemv(&x, act).unwrap().expect("the plain GEMV applies");
                        set_enabled(&[Fused::All]);
                        let d = max_abs_diff(&y, &p);
                        assert_eq!(d, 0.0, "{why}: early against plain");
                    }
                }
            }
        }
    }
    // The GEMV off: 1–4 rows on the tensor-core kernel.
    set_enabled(&all_but(Fused::Gemv));
    let w = (randn(&[1001, 1280], &dev) * 0.05).unwrap();
    let fp8 = Fp8Weight::quantize(&w, None).unwrap();
    let wf = fp8.dequantize(DType::F32).unwrap().t().unwrap();
    for rows in 1..=4 {
        let x = randn(&[rows, 1280], &dev).to_dtype(DType::BF16).unwrap();
        let y = fp8
            .gemv(&x, Act::None)
            .unwrap()
            .expect("the tensor-core kernel applies");
        let r = rel(&y, &x.to_dtype(DType::F32).unwrap().matmul(&wf).unwrap());
        assert!(r < 1e-2, "{rows} rows, the GEMV off: rel {r}");
    }
    set_enabled(&[Fused::All]);
    // Seventeen rows, K off the 64-wide slices at 5 rows, and fp32 rows are the dequantized
    // weight's.
    let fp8 = Fp8Weight::quantize(&randn(&[40, 64], &dev), None).unwrap();
    let x = randn(&[17, 64], &dev).to_dtype(DType::BF16).unwrap();
    assert!(fp8.gemv(&x, Act::None).unwrap().is_none());
    let fp8_k32 = Fp8Weight::quantize(&randn(&[40, 32], &dev), None).unwrap();
    let x = randn(&[5, 32], &dev).to_dtype(DType::BF16).unwrap();
    assert!(fp8_k32.gemv(&x, Act::None).unwrap().is_none());
    assert!(fp8
        .gemv(&randn(&[1, 64], &dev), Act::None)
        .unwrap()
        .is_none());
}

/// The dequantization kernel gives candle's cast times the scale: bit for bit in f32 (both
/// multiply the exact E4M3 value by the f32 scale), within one rounding in bf16 / f16; and the
/// GPU's quantized bytes are the CPU's.
#[test]
fn fp8_dequantization_is_candles_cast_times_the_scale() {
    let (dev, _one_at_a_time) = gpu();
    let w = (randn(&[96, 256], &dev) * 0.3).unwrap();
    let on_gpu = Fp8Weight::quantize(&w, None).unwrap();
    let on_cpu = Fp8Weight::quantize(&w.to_device(&Device::Cpu).unwrap(), None).unwrap();
    let cpu: Vec<Vec<f32>> = on_cpu.dequantize(DType::F32).unwrap().to_vec2().unwrap();
    let gpu32: Vec<Vec<f32>> = on_gpu.dequantize(DType::F32).unwrap().to_vec2().unwrap();
    assert_eq!(gpu32, cpu, "the GPU's E4M3 values and scales are the CPU's");
    for dtype in [DType::BF16, DType::F16] {
        let half = on_gpu.dequantize(dtype).unwrap();
        let want = Tensor::new(cpu.clone(), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert_eq!(
            rel(&half, &want),
            0.,
            "{dtype:?}: one rounding of the same product"
        );
    }
}

/// gpt2 and BLOOM at head sizes 64 / 128 (fp8's 16-byte rows) in bf16 with fp8 weights: the
/// cached prefill and five decode steps of 2 rows (the fp8 GEMV) and 6 (the tensor-core
/// kernel) against `--fused none` (the weights dequantized, candle's matmuls); then greedy ids
/// of graph-replayed decoding against eager on the same kernels, at 2 rows and 6.
#[test]
fn fp8_decoding_matches_the_dequantized_weights() {
    use crate::models::generate::{generate, left_pad, Greedy};
    let (gpu, _one_at_a_time) = gpu();
    let ids = |n: u32| (0..n).map(|i| 1 + i * 7 % 50).collect::<Vec<u32>>();
    let src = WeightSource::Random { seed: 0 };
    for spec in super::decode::wide_head_specs() {
        let name = &spec.name;
        for rows in [2, 6] {
            let steps = [Fused::None, Fused::All]
                .map(|f| super::decode::decode_steps(&gpu, &spec, DType::BF16, rows, f, true));
            for (i, (fused, none)) in steps[1].iter().zip(&steps[0]).enumerate() {
                let r = rel(fused, none);
                assert!(r < 3e-2, "{name} fp8 {rows} rows step {i}: rel {r}");
            }
        }
        let g = Greedy {
            new_tokens: 8,
            banned: vec![],
        };
        let eager = [
            Fused::Lt,
            Fused::LayerNorm,
            Fused::Decode,
            Fused::Gemv,
            Fused::SkinnyProj,
            Fused::Prefill,
        ];
        for rows in [2usize, 6] {
            let prompts: Vec<Vec<u32>> = (0..rows as u32).map(|r| ids(9 + 5 * r)).collect();
            let prompts = left_pad(&prompts, 0, &gpu).unwrap();
            let mut out = Vec::new();
            for paths in [&eager[..], &[Fused::All][..]] {
                set_enabled(paths);
                let mut model = spec.load(&src, DType::BF16, &gpu).unwrap();
                model.quantize_fp8().unwrap();
                out.push(generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap());
            }
            assert_eq!(out[1], out[0], "{name}: {rows} rows, graph against eager");
        }
    }
}
