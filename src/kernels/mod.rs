//! Fused CUDA kernels (`fused.cu`, PTX built by build.rs) and cuBLASLt epilogues for the
//! candle engine. The profile in docs/perf-notes.md says why each exists: candle runs a bias
//! add, an activation, a scale, a cast, a mask add and a softmax as separate passes, and its
//! broadcast add takes the slow strided path.
//!
//! Every entry point returns `Ok(None)` where it does not apply (a CPU tensor, a kernel
//! switched off with `--fused`, a dtype or layout it does not take); the caller then runs
//! candle's composed ops, which stay the reference that the GPU tests compare against.

use candle_core::{Result, Tensor};
use std::sync::atomic::{AtomicU8, Ordering};

/// The fused paths `--fused` switches (each on by default on CUDA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fused {
    /// Every fused path.
    All,
    /// None: candle's own ops only (the "before" of docs/perf-notes.md).
    None,
    /// Inference projections as one cuBLASLt matmul with the bias (and GELU) in its epilogue.
    Lt,
    /// Attention softmax: scale, mask / ALiBi bias, softmax and dropout in one pass; its backward.
    Softmax,
    /// Bias + activation in one pass, with its backward (training; inference in fp32).
    BiasAct,
    /// AdamW in two passes per parameter instead of ~12 ops.
    Adamw,
}

const LT: u8 = 1;
const SOFTMAX: u8 = 2;
const BIAS_ACT: u8 = 4;
const ADAMW: u8 = 8;
const ALL: u8 = LT | SOFTMAX | BIAS_ACT | ADAMW;

static ENABLED: AtomicU8 = AtomicU8::new(ALL);

fn bit(f: Fused) -> u8 {
    match f {
        Fused::All => ALL,
        Fused::None => 0,
        Fused::Lt => LT,
        Fused::Softmax => SOFTMAX,
        Fused::BiasAct => BIAS_ACT,
        Fused::Adamw => ADAMW,
    }
}

/// Process-wide, like the matmul precision mode: set once from the command line.
pub fn set_enabled(list: &[Fused]) {
    ENABLED.store(
        list.iter().fold(0, |acc, &f| acc | bit(f)),
        Ordering::Relaxed,
    );
}

fn on(b: u8) -> bool {
    ENABLED.load(Ordering::Relaxed) & b != 0
}

/// The enabled paths as `--fused` takes them, for the log header ("none" when off).
pub fn describe() -> String {
    let names: Vec<&str> = [
        (LT, "lt"),
        (SOFTMAX, "softmax"),
        (BIAS_ACT, "bias-act"),
        (ADAMW, "adamw"),
    ]
    .iter()
    .filter(|(b, _)| on(*b))
    .map(|&(_, n)| n)
    .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(",")
    }
}

/// The activation a fused epilogue applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    None,
    /// tanh approximation (gelu_new, bloom_gelu); cuBLASLt's GELU epilogue is this one.
    GeluTanh,
    GeluErf,
    Relu,
}

impl Act {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn code(self) -> i32 {
        match self {
            Act::None => 0,
            Act::GeluTanh => 1,
            Act::GeluErf => 2,
            Act::Relu => 3,
        }
    }
}

/// act(x Wᵀ + b) (`w_out_in`: W is (out, in), nn.Linear) or act(x W + b) (W (in, out), GPT-2's
/// Conv1D) as one cuBLASLt call, bias and activation in the epilogue. x: (N, in) -> (N, out).
/// Inference only (no backward): `None` when x or W is tracked by autograd, and for fp32
/// (cudarc's cuBLASLt computes fp32 as TF32), for ReLU and erf-GELU (no exact epilogue).
pub fn linear(
    x: &Tensor,
    w: &Tensor,
    w_out_in: bool,
    b: &Tensor,
    act: Act,
) -> Result<Option<Tensor>> {
    if !on(LT) || x.track_op() || w.track_op() || b.track_op() {
        return Ok(None);
    }
    imp::linear(x, w, w_out_in, b, act)
}

/// act(x + b) over (N, C) in one pass, differentiable (its backward is one more fused pass and
/// a column sum for the bias).
pub fn bias_act(x: &Tensor, b: &Tensor, act: Act) -> Result<Option<Tensor>> {
    if !on(BIAS_ACT) {
        return Ok(None);
    }
    imp::bias_act(x, b, act)
}

/// Dropped-out attention probabilities of raw scores s = q kᵀ, (B, nh, Tq, Tk):
/// softmax(scale·s + bias) ⊙ keep / (1 − p), with `keep` = (u8 keep-mask, p). `bias`: f32,
/// (B, 1 | nh, Tq, Tk). With `with_probs`, also the probabilities before dropout (for the
/// backward). Not differentiable: the inference path, and the recompute of the training one.
pub fn attn_softmax(
    s: &Tensor,
    bias: &Tensor,
    scale: f64,
    keep: Option<(&Tensor, f32)>,
    with_probs: bool,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    if !on(SOFTMAX) {
        return Ok(None);
    }
    imp::attn_softmax(s, bias, scale, keep, with_probs)
}

/// Gradient w.r.t. the raw scores s of [`attn_softmax`], from the probabilities `p` (before
/// dropout) and the gradient w.r.t. the dropped probabilities `dpd`.
pub fn attn_softmax_bwd(
    p: &Tensor,
    dpd: &Tensor,
    scale: f64,
    keep: Option<(&Tensor, f32)>,
) -> Result<Option<Tensor>> {
    if !on(SOFTMAX) {
        return Ok(None);
    }
    imp::attn_softmax_bwd(p, dpd, scale, keep)
}

/// AdamW hyper-parameters of one step (see `train::AdamW`).
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// 1 − β1ᵗ and √(1 − β2ᵗ).
    pub bc1: f64,
    pub bc2_sqrt: f64,
}

/// One AdamW step of `param` (updated in place) with gradient `grad`; `mv` (2, numel) f32
/// holds the moments. Returns the new moments.
pub fn adamw(param: &Tensor, grad: &Tensor, mv: &Tensor, h: &AdamStep) -> Result<Option<Tensor>> {
    if !on(ADAMW) {
        return Ok(None);
    }
    imp::adamw(param, grad, mv, h)
}

/// The ops need a GPU: a CPU build has none of them.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{Act, AdamStep};
    use candle_core::{Result, Tensor};

    pub fn linear(_: &Tensor, _: &Tensor, _: bool, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn bias_act(_: &Tensor, _: &Tensor, _: Act) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn attn_softmax(
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: Option<(&Tensor, f32)>,
        _: bool,
    ) -> Result<Option<(Tensor, Option<Tensor>)>> {
        Ok(None)
    }
    pub fn attn_softmax_bwd(
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: Option<(&Tensor, f32)>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn adamw(_: &Tensor, _: &Tensor, _: &Tensor, _: &AdamStep) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
use cuda as imp;

#[cfg(all(test, feature = "cuda"))]
mod gpu_tests;
