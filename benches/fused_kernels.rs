//! The fused CUDA kernels against candle's composed ops under criterion (#38 item 4), one GPU,
//! bf16, at the shapes the suites meet (gpt2 training: 8 × 1024 rows of 768 or 3072; bloom-7b1
//! decoding: 16 rows of 4096). Each iteration queues the op and waits for the device, so the
//! time is the GPU's. Built here, run on the GPU host (no Rust there):
//!   cargo bench --no-default-features --features cuda --bench fused_kernels --no-run
//!   <the printed executable> --bench                     (scripts/gpu_checks.sh criterion)
//! Each pair's results must agree first (checked before timing, to the dtype's rounding).

use candle_core::{DType, Device, Tensor, D};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use transformer_bench::kernels::{self, Act};

fn gpu() -> Device {
    Device::new_cuda(0).expect("a CUDA GPU: this bench runs on the GPU host")
}

fn randn(shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    Tensor::randn(0f32, 1., shape, dev)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

/// The largest |a − b| over the elements, in f32.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap()).unwrap();
    d.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Times `fused` and `composed` as `name/fused` and `name/candle`, after checking that they
/// agree within `tol`.
fn pair(
    c: &mut Criterion,
    name: &str,
    tol: f32,
    fused: impl Fn() -> Tensor,
    composed: impl Fn() -> Tensor,
) {
    let diff = max_diff(&fused(), &composed());
    assert!(diff <= tol, "{name}: fused and composed differ by {diff}");
    let dev = fused().device().clone();
    let mut g = c.benchmark_group(name);
    g.bench_function("fused", |b| {
        b.iter(|| {
            black_box(fused());
            dev.synchronize().unwrap()
        })
    });
    g.bench_function("candle", |b| {
        b.iter(|| {
            black_box(composed());
            dev.synchronize().unwrap()
        })
    });
    g.finish();
}

fn norms(c: &mut Criterion) {
    let dev = gpu();
    let bf = DType::BF16;
    let (x, w, b) = (
        randn(&[8192, 768], bf, &dev),
        randn(&[768], bf, &dev),
        randn(&[768], bf, &dev),
    );
    pair(
        c,
        "layer norm (8192, 768)",
        0.07,
        || {
            kernels::layer_norm(&x, &w, &b, 1e-5)
                .unwrap()
                .expect("fused")
        },
        || candle_nn::ops::layer_norm_slow(&x, &w, &b, 1e-5).unwrap(),
    );
    let (x, r) = (randn(&[16, 4096], bf, &dev), randn(&[16, 4096], bf, &dev));
    let (w, b) = (randn(&[4096], bf, &dev), randn(&[4096], bf, &dev));
    pair(
        c,
        "residual add + layer norm (16, 4096)",
        0.07,
        || {
            kernels::add_layer_norm(&x, &r, &w, &b, 1e-5)
                .unwrap()
                .expect("fused")
                .1
        },
        || candle_nn::ops::layer_norm_slow(&(&x + &r).unwrap(), &w, &b, 1e-5).unwrap(),
    );
}

fn activations(c: &mut Criterion) {
    let dev = gpu();
    let bf = DType::BF16;
    let (x, b) = (randn(&[8192, 3072], bf, &dev), randn(&[3072], bf, &dev));
    pair(
        c,
        "bias + GELU (8192, 3072)",
        0.07,
        || {
            kernels::bias_act(&x, &b, Act::GeluTanh)
                .unwrap()
                .expect("fused")
        },
        || x.broadcast_add(&b).unwrap().gelu().unwrap(),
    );
    // gpt2's attention scores at 8 × 1024: (B, nh, T, T) with the causal bias (B, 1, T, T) f32.
    let s = randn(&[8, 12, 1024, 1024], bf, &dev);
    let t = 1024;
    let causal: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t <= i / t {
                0.
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let bias = Tensor::from_vec(causal, (1, 1, t, t), &dev)
        .unwrap()
        .broadcast_as((8, 1, t, t))
        .unwrap()
        .contiguous()
        .unwrap();
    let scale = 0.125;
    pair(
        c,
        "attention softmax (8, 12, 1024, 1024)",
        0.01,
        || {
            kernels::attn_softmax(&s, &bias, scale, None, false)
                .unwrap()
                .expect("fused")
                .0
        },
        || {
            let z = (s.to_dtype(DType::F32).unwrap() * scale).unwrap();
            let z = z.broadcast_add(&bias).unwrap();
            candle_nn::ops::softmax_last_dim(&z)
                .unwrap()
                .to_dtype(bf)
                .unwrap()
        },
    );
}

fn loss(c: &mut Criterion) {
    let dev = gpu();
    let v = 50257;
    let logits = randn(&[8192, v], DType::BF16, &dev);
    let targets = Tensor::arange(0u32, 8192, &dev).unwrap();
    pair(
        c,
        "cross-entropy (8192, 50257)",
        1e-3,
        || {
            kernels::cross_entropy(&logits, &targets, v)
                .unwrap()
                .expect("fused")
        },
        || {
            let lf = logits.to_dtype(DType::F32).unwrap();
            let logp = candle_nn::ops::log_softmax(&lf, D::Minus1).unwrap();
            let picked = logp.gather(&targets.unsqueeze(1).unwrap(), 1).unwrap();
            picked.squeeze(1).unwrap().neg().unwrap() // (N,), as the kernel's
        },
    );
}

criterion_group! {
    name = fused_kernels;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = norms, activations, loss
}
criterion_main!(fused_kernels);
