//! The fused kernels against candle's composed ops, on a GPU (a crate-level test module: it
//! drives the models, the trainer and NCCL, which the kernels themselves do not import). They exist only in CUDA builds
//! and run on the GPU host (`scripts/gpu_checks.sh kernels`); without a GPU they fail, they
//! do not skip. Each compares the fused path on CUDA with the composed ops (on CUDA, or on
//! the CPU for AdamW); fp32 tolerances are rounding-level, half precision ones a few bf16 ulps.
//!
//! One file a family: the projections (`matmul`), the one-pass layer kernels (`ops`),
//! attention (`attention`), the scoring forward's attention (`prefill`), the optimizer step (`optimizer`), whole models forward and in
//! training (`models`), generation (`decode`), its cluster attention (`cluster`), fp8 weights (`fp8`), the norms folded into the GEMVs (`norm_fold`), the PTX of the kernels
//! programmatic edges start early (`pdl`). Here: what they share.

use crate::kernels::*;
use crate::models::{ModelSpec, WeightSource};
use crate::train::{Hyper, Trainer};
use candle_core::{DType, Device, Tensor};

mod attention;
mod cluster;
mod decode;
mod fp8;
mod matmul;
mod models;
mod norm_fold;
mod norm_stats;
mod ops;
mod optimizer;
mod pdl;
mod prefill;
mod step;
mod step_io;

/// The tests switch `--fused` process-wide (reference runs use none): one at a time.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gpu() -> (Device, std::sync::MutexGuard<'static, ()>) {
    let guard = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_enabled(&[Fused::All]);
    (
        Device::new_cuda(0).expect("these tests need a CUDA GPU"),
        guard,
    )
}

/// Every fused path but `off` (and the switchboard's All / None).
fn all_but(off: Fused) -> Vec<Fused> {
    use clap::ValueEnum;
    Fused::value_variants()
        .iter()
        .copied()
        .filter(|&f| !matches!(f, Fused::All | Fused::None) && f != off)
        .collect()
}

/// max |a − b| over the elements, in f32: 0 exactly where a and b hold the same values.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let d = (f(a) - f(b)).unwrap().abs().unwrap().max_all().unwrap();
    d.to_scalar::<f32>().unwrap()
}

/// max |a − b| / max |b|, both as f32.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.to_dtype(DType::F32).unwrap(),
        b.to_dtype(DType::F32).unwrap(),
    );
    let a = a.to_device(&Device::Cpu).unwrap();
    let b = b.to_device(&Device::Cpu).unwrap();
    let d = (&a - &b).unwrap().abs().unwrap().flatten_all().unwrap();
    let d = d.max(0).unwrap().to_scalar::<f32>().unwrap();
    let m = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
    d / m.to_scalar::<f32>().unwrap().max(1e-12)
}

/// Where a head's q, k and v sit in a qkv row: BLOOM's (nh, 3, hs), or GPT-2's [q | k | v] of
/// `c` channels each.
fn qkv_layout(bloom: bool, hs: usize, c: usize) -> QkvLayout {
    match bloom {
        true => QkvLayout {
            head_stride: 3 * hs,
            part: hs,
        },
        false => QkvLayout {
            head_stride: hs,
            part: c,
        },
    }
}

fn randn(shape: &[usize], dev: &Device) -> Tensor {
    Tensor::randn(0f32, 1., shape, dev).unwrap()
}

fn act_ref(y: &Tensor, act: Act) -> Tensor {
    match act {
        Act::None => y.clone(),
        Act::GeluTanh => y.gelu().unwrap(),
        Act::GeluErf => y.gelu_erf().unwrap(),
        Act::Relu => y.relu().unwrap(),
    }
}

/// A gpt2-tiny trainer on `dev` (random weights, seed 0) and a (2, 64) batch of ids.
fn tiny_gpt2_trainer(dev: &Device, dtype: DType, dropout: bool) -> (Trainer, Tensor) {
    trainer_of(ModelSpec::preset("gpt2-tiny").unwrap(), dev, dtype, dropout)
}

/// A trainer of `spec` on `dev` (random weights, seed 0) and a (2, 64) batch of ids.
fn trainer_of(spec: ModelSpec, dev: &Device, dtype: DType, dropout: bool) -> (Trainer, Tensor) {
    let src = WeightSource::Random { seed: 0 };
    let ids: Vec<u32> = (0..2 * 64)
        .map(|i| ((i * 7919 + 13) % 50257) as u32)
        .collect();
    let ids = Tensor::from_vec(ids, (2, 64), dev).unwrap();
    let trainer = Trainer::new(&spec, &src, dtype, dev, Hyper::default(), dropout).unwrap();
    (trainer, ids)
}
