//! Model FLOPs of a suite's work, per-GPU peak FLOP/s, and MFU.
//!
//! MFU = achieved model FLOP/s ÷ the GPU's dense peak for the run's precision, where achieved
//! = [`lambada_forward_flops`] summed over the timed batches ÷ `timed_seconds` (the sum of batch
//! latencies). Model FLOPs count the useful work of the formula below, not what a kernel
//! happens to execute: padding, masked attention entries and recomputation are left out, so
//! both engines are measured against the same number.

use crate::device::Precision;
use crate::models::{Architecture, ModelSpec};

/// The matmul shapes of a decoder-only transformer (shape legend: `L` layers, `C` channels,
/// `F` MLP inner size, `V` vocabulary).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_inner: usize,
    pub vocab_size: usize,
}

impl ModelShape {
    pub fn of(spec: &ModelSpec) -> Self {
        match &spec.arch {
            Architecture::Gpt2(c) => Self {
                n_layer: c.n_layer,
                n_embd: c.n_embd,
                n_inner: c.n_inner.unwrap_or(4 * c.n_embd),
                vocab_size: c.vocab_size,
            },
            Architecture::Bloom(c) => Self {
                n_layer: c.n_layer,
                n_embd: c.hidden_size,
                n_inner: 4 * c.hidden_size,
                vocab_size: c.vocab_size,
            },
        }
    }
}

/// FLOPs of one LAMBADA passage's forward (a multiply-add counts 2), for `n` input tokens
/// (context + target minus the last token, no padding) of which `m` rows go through the LM head
/// (one per target token):
///
/// ```text
///   L · n · (2·4C²  +  2·2·C·F)      QKV + output projections, MLP up + down
/// + L · 2·2·n²·C                      scores QKᵀ and weights·V, the full n×n square
/// + m · 2·C·V                         LM head on the scored rows only
/// ```
///
/// Left out: embeddings (lookups), layernorms, biases, GELU, softmax and the log-softmax
/// (O(n·C) or O(n²·nh), under 1% at GPT-2 sizes); BLOOM's ALiBi bias add. GPT-2 and BLOOM both
/// have these matmuls (F = 4C unless GPT-2's `n_inner` says otherwise).
pub fn lambada_forward_flops(s: &ModelShape, n: usize, m: usize) -> f64 {
    let (l, c, f, v) = (
        s.n_layer as f64,
        s.n_embd as f64,
        s.n_inner as f64,
        s.vocab_size as f64,
    );
    let (n, m) = (n as f64, m as f64);
    l * n * (8. * c * c + 4. * c * f) + l * 4. * n * n * c + m * 2. * c * v
}

/// FLOPs of training on one block of `t` tokens: forward and backward, the backward twice the
/// forward (a gradient for the inputs and one for the weights of every matmul), every position
/// through the LM head (the loss reads them all):
///
/// ```text
///   3 · lambada_forward_flops(t, t)
/// ```
///
/// Recomputation is not counted (candle's attention core, llm.c's GELU with `-r 1`): every
/// engine is measured against the same useful work.
pub fn train_block_flops(s: &ModelShape, t: usize) -> f64 {
    3. * lambada_forward_flops(s, t, t)
}

/// Dense (no sparsity) peak TFLOP/s of a GPU for a precision, from the vendor datasheets:
/// H100 SXM5 / H200 (NVIDIA H100 and H200 datasheets), H100 PCIe, H100 NVL, A100 and A800
/// (A100 datasheet; A800 has A100's compute), V100 SXM2 and PCIe (V100 datasheet; no bf16 or
/// tf32: tf32 runs as fp32), L4, L40, L40S (their datasheets; listed before L4, which their names contain), GeForce RTX 3080/3090/3090 Ti and 4080/4090
/// (Ampere GA102 and Ada whitepapers: tensor fp16/bf16 with fp32 accumulate, which is what
/// cuBLAS uses for our fp16/bf16 GEMMs; GeForce runs that at half the fp16-accumulate rate).
/// `fp32` is the non-tensor-core rate. The first matching name wins, so specific names
/// come first. Matching is on NVML's name, case-insensitive.
pub const PEAK_TFLOPS: &[(&str, [f64; 4])] = &[
    //  name substring      fp32   tf32   fp16   bf16
    ("H100 PCIe", [51.2, 378.0, 756.0, 756.0]),
    ("H100 NVL", [60.0, 417.5, 835.0, 835.0]),
    ("H100", [66.9, 494.7, 989.4, 989.4]),
    ("H200 NVL", [60.0, 417.5, 835.0, 835.0]),
    ("H200", [66.9, 494.7, 989.4, 989.4]),
    ("A100", [19.5, 156.0, 312.0, 312.0]),
    ("A800", [19.5, 156.0, 312.0, 312.0]),
    ("V100-PCIE", [14.0, 14.0, 112.0, f64::NAN]),
    ("V100", [15.7, 15.7, 125.0, f64::NAN]),
    ("L40S", [91.6, 183.0, 362.0, 362.0]),
    ("L40", [90.5, 90.5, 181.0, 181.0]),
    ("L4", [30.3, 60.0, 121.0, 121.0]),
    ("RTX 3090 Ti", [40.0, 40.0, 80.0, 80.0]),
    ("RTX 3090", [35.6, 35.6, 71.0, 71.0]),
    ("RTX 3080", [29.8, 29.8, 59.5, 59.5]),
    ("RTX 4090", [82.6, 82.6, 165.2, 165.2]),
    ("RTX 4080", [48.7, 48.7, 97.5, 97.5]),
];

/// The peak of [`PEAK_TFLOPS`] for this GPU name and precision; None for unknown GPUs (and
/// CPUs) and for precisions the GPU lacks (bf16 on V100).
pub fn peak_tflops(gpu_name: &str, precision: Precision) -> Option<f64> {
    let name = gpu_name.to_ascii_lowercase();
    let (_, peaks) = PEAK_TFLOPS
        .iter()
        .find(|(key, _)| name.contains(&key.to_ascii_lowercase()))?;
    let col = match precision {
        Precision::Fp32 => 0,
        Precision::Tf32 => 1,
        Precision::Fp16 => 2,
        // fp8 weights multiply in bf16.
        Precision::Bf16 | Precision::Fp8 => 3,
    };
    Some(peaks[col]).filter(|p| p.is_finite())
}

/// Achieved TFLOP/s and MFU (a fraction, 0..1) of `flops` done in `seconds` on `devices` GPUs
/// of `peak_tflops` each (the run's FLOPs are all ranks' together).
pub fn mfu(
    flops: f64,
    seconds: f64,
    peak_tflops: Option<f64>,
    devices: usize,
) -> (Option<f64>, Option<f64>) {
    if seconds <= 0. || flops <= 0. {
        return (None, None);
    }
    let achieved = flops / seconds / 1e12;
    let peak = peak_tflops.map(|p| p * devices.max(1) as f64);
    (Some(achieved), peak.map(|p| achieved / p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_flops_match_the_hand_count() {
        let s = ModelShape::of(&ModelSpec::preset("gpt2").unwrap());
        assert_eq!(
            (s.n_layer, s.n_embd, s.n_inner, s.vocab_size),
            (12, 768, 3072, 50257)
        );
        // 2·(12·12·768²) per token for the blocks: 2 × the 85M non-embedding matmul weights.
        let per_token = lambada_forward_flops(&s, 1, 0) - 12. * 4. * 768.;
        assert_eq!(per_token, 2. * 12. * 12. * 768. * 768.);
        // One scored row: the LM head, 2·C·V.
        let head = lambada_forward_flops(&s, 1, 1) - lambada_forward_flops(&s, 1, 0);
        assert_eq!(head, 2. * 768. * 50257.);
        // Attention grows with n².
        let attn = |n: usize| lambada_forward_flops(&s, n, 0) - n as f64 * per_token;
        assert_eq!(attn(100), 12. * 4. * 100. * 100. * 768.);
        let bloom = ModelShape::of(&ModelSpec::preset("bloom-560m").unwrap());
        assert_eq!((bloom.n_embd, bloom.n_inner), (1024, 4096));
    }

    /// Two data-parallel GPUs doing twice one GPU's FLOPs in the same time: the same MFU (it
    /// was once reported against one GPU's peak: 34.5 % for 2 × 17 %).
    #[test]
    fn mfu_is_against_every_gpu_of_the_run() {
        let (one, mfu_one) = mfu(1e15, 1., Some(1000.), 1);
        let (two, mfu_two) = mfu(2e15, 1., Some(1000.), 2);
        assert_eq!((one, two), (Some(1000.), Some(2000.)));
        assert_eq!((mfu_one, mfu_two), (Some(1.), Some(1.)));
        assert_eq!(mfu(1e15, 0., Some(1000.), 1), (None, None));
    }

    #[test]
    fn training_counts_three_forwards_over_every_position() {
        let s = ModelShape::of(&ModelSpec::preset("gpt2").unwrap());
        let f = train_block_flops(&s, 1024);
        assert_eq!(f, 3. * lambada_forward_flops(&s, 1024, 1024));
        // 6 FLOPs per matmul weight and token (85M block weights, the 38.6M-weight LM
        // head), plus attention's 3 · 4·L·T²·C: 0.875 TFLOP a block of 1024.
        assert!((f / 1e12 - 0.87494).abs() < 1e-5, "{f}");
    }

    #[test]
    fn peaks_by_name_and_precision() {
        let h100 = "NVIDIA H100 80GB HBM3";
        assert_eq!(peak_tflops(h100, Precision::Bf16), Some(989.4));
        assert_eq!(peak_tflops(h100, Precision::Tf32), Some(494.7));
        assert_eq!(peak_tflops(h100, Precision::Fp32), Some(66.9));
        assert_eq!(
            peak_tflops("NVIDIA H100 PCIe", Precision::Fp16),
            Some(756.0)
        );
        assert_eq!(peak_tflops("NVIDIA H200", Precision::Bf16), Some(989.4));
        assert_eq!(
            peak_tflops("NVIDIA A100-SXM4-80GB", Precision::Bf16),
            Some(312.0)
        );
        assert_eq!(peak_tflops("Tesla V100-SXM2-32GB", Precision::Bf16), None);
        assert_eq!(
            peak_tflops("Tesla V100-PCIE-16GB", Precision::Fp16),
            Some(112.0)
        );
        assert_eq!(
            peak_tflops("NVIDIA GeForce RTX 3090 Ti", Precision::Fp16),
            Some(80.0)
        );
        assert_eq!(peak_tflops("NVIDIA L40S", Precision::Bf16), Some(362.0));
        assert_eq!(peak_tflops("Intel Xeon", Precision::Fp32), None);
        let (tflops, mfu) = mfu(989.4e12, 2.0, Some(989.4), 1);
        assert_eq!((tflops, mfu), (Some(494.7), Some(0.5)));
    }
}
