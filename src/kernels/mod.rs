//! Fused CUDA kernels (`fused.cu`, PTX built by build.rs) and cuBLASLt epilogues for the
//! candle engine. The profile in docs/perf-notes.md says why each exists: candle runs a bias
//! add, an activation, a scale, a cast, a mask add and a softmax as separate passes, and its
//! broadcast add takes the slow strided path.
//!
//! Every entry point returns `Ok(None)` where it does not apply (a CPU tensor, a kernel
//! switched off with `--fused`, a dtype or layout it does not take); the caller then runs
//! candle's composed ops, which stay the reference that the GPU tests compare against.

use candle_core::{Device, Result, Shape, Tensor};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

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
    /// Training LayerNorm: one kernel forward, two backward (instead of ~10 ops with casts).
    LayerNorm,
    /// Dropout masks drawn inside the kernels from a hash (nothing stored; the backward
    /// redraws them) instead of candle's f32 uniforms + compare.
    Dropout,
    /// Training loss: cross-entropy over the logits in one kernel each way (no f32 copies).
    CrossEntropy,
}

const LT: u8 = 1;
const SOFTMAX: u8 = 2;
const BIAS_ACT: u8 = 4;
const ADAMW: u8 = 8;
const LAYER_NORM: u8 = 16;
const DROPOUT: u8 = 32;
const XENT: u8 = 64;
const ALL: u8 = LT | SOFTMAX | BIAS_ACT | ADAMW | LAYER_NORM | DROPOUT | XENT;

static ENABLED: AtomicU8 = AtomicU8::new(ALL);

fn bit(f: Fused) -> u8 {
    match f {
        Fused::All => ALL,
        Fused::None => 0,
        Fused::Lt => LT,
        Fused::Softmax => SOFTMAX,
        Fused::BiasAct => BIAS_ACT,
        Fused::Adamw => ADAMW,
        Fused::LayerNorm => LAYER_NORM,
        Fused::Dropout => DROPOUT,
        Fused::CrossEntropy => XENT,
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

/// Whether the fused path `f` (one path, not `All` / `None`) is switched on.
pub fn enabled(f: Fused) -> bool {
    on(bit(f))
}

/// The enabled paths as `--fused` takes them, for the log header ("none" when off).
pub fn describe() -> String {
    let names: Vec<&str> = [
        (LT, "lt"),
        (SOFTMAX, "softmax"),
        (BIAS_ACT, "bias-act"),
        (ADAMW, "adamw"),
        (LAYER_NORM, "layer-norm"),
        (DROPOUT, "dropout"),
        (XENT, "cross-entropy"),
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

/// A dropout keep-mask: kept elements are scaled by 1/(1 − p), the rest zeroed.
#[derive(Clone, Debug)]
pub enum Keep {
    /// A u8 tensor (1 = kept) of the masked shape: candle's `rand` + `ge` (the CPU, and
    /// `--fused` without `dropout`).
    Mask(Tensor),
    /// Drawn inside the kernels from a hash of (key, element index); nothing is stored.
    Hash(u64),
}

static DROPOUT_SEED: AtomicU64 = AtomicU64::new(0);
static DROPOUT_DRAWS: AtomicU64 = AtomicU64::new(0);

/// Seeds the hashed dropout masks (the run's `--seed`): the same run draws the same masks.
pub fn set_dropout_seed(seed: u64) {
    DROPOUT_SEED.store(seed, Ordering::Relaxed);
    DROPOUT_DRAWS.store(0, Ordering::Relaxed);
}

/// splitmix64's finalizer: well-mixed keys from a seed and a draw counter.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

/// The next hash key: a new mask per draw, the same sequence for the same seed.
fn next_key() -> u64 {
    let draw = DROPOUT_DRAWS.fetch_add(1, Ordering::Relaxed);
    mix(DROPOUT_SEED.load(Ordering::Relaxed) ^ mix(draw.wrapping_add(1)))
}

/// A fresh keep-mask with drop probability `p` for a tensor of `shape`: hashed on CUDA when
/// `dropout` is fused, else a u8 tensor from `rand` + `ge`.
pub fn draw_keep(shape: &Shape, p: f32, dev: &Device) -> Result<Keep> {
    if on(DROPOUT) && dev.is_cuda() {
        return Ok(Keep::Hash(next_key()));
    }
    Ok(Keep::Mask(Tensor::rand(0f32, 1., shape, dev)?.ge(p)?))
}

/// The keep-mask as a u8 tensor of `shape` (1 = kept), for the composed ops.
pub fn keep_mask(keep: &Keep, p: f32, shape: &Shape, dev: &Device) -> Result<Tensor> {
    match keep {
        Keep::Mask(m) => Ok(m.clone()),
        Keep::Hash(key) => imp::hash_mask(*key, p, shape, dev),
    }
}

/// Inverted dropout with a hashed mask, differentiable (its backward redraws the mask):
/// one pass each way instead of rand, ge, mul and affine. `None` off CUDA or when `dropout`
/// is not fused.
pub fn dropout(x: &Tensor, p: f32) -> Result<Option<Tensor>> {
    if !on(DROPOUT) || !x.device().is_cuda() {
        return Ok(None);
    }
    imp::dropout(x, next_key(), p)
}

/// LayerNorm over the last dim, differentiable: x (…, C), w and b (C,), statistics in f32.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Option<Tensor>> {
    if !on(LAYER_NORM) {
        return Ok(None);
    }
    imp::layer_norm(x, w, b, eps)
}

/// −log softmax(logits)[target] per row over the first `vocab` columns: logits (N, V ≥ vocab)
/// (a padded lm head's extra columns are ignored and get zero gradient), targets (N,) u32 ->
/// (N,) f32, differentiable w.r.t. the logits (the backward recomputes the log-sum-exp).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, vocab: usize) -> Result<Option<Tensor>> {
    if !on(XENT) {
        return Ok(None);
    }
    imp::cross_entropy(logits, targets, vocab)
}

/// Dropped-out attention probabilities of raw scores s = q kᵀ, (B, nh, Tq, Tk):
/// softmax(scale·s + bias) ⊙ keep / (1 − p), with `keep` = (keep-mask, p). `bias`: f32,
/// (B, 1 | nh, Tq, Tk). With `with_probs`, also the probabilities before dropout (for the
/// backward). Not differentiable: the inference path, and the recompute of the training one.
pub fn attn_softmax(
    s: &Tensor,
    bias: &Tensor,
    scale: f64,
    keep: Option<(&Keep, f32)>,
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
    keep: Option<(&Keep, f32)>,
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
    /// Multiplies every gradient first: the clip coefficient (over a loss scale). Folded into
    /// the kernel instead of one more pass per tensor.
    pub grad_scale: f64,
}

/// Σ x² over a whole tensor as a (1,) f32 tensor, in one pass (with `adamw`: the gradient
/// norm before the step, instead of a square and a sum per tensor).
pub fn sum_squares(x: &Tensor) -> Result<Option<Tensor>> {
    if !on(ADAMW) {
        return Ok(None);
    }
    imp::sum_squares(x)
}

/// One AdamW step of `param` (updated in place) with gradient `grad · grad_scale`; `mv`
/// (2, numel) f32 holds the moments. Returns the new moments.
pub fn adamw(param: &Tensor, grad: &Tensor, mv: &Tensor, h: &AdamStep) -> Result<Option<Tensor>> {
    if !on(ADAMW) {
        return Ok(None);
    }
    imp::adamw(param, grad, mv, h)
}

/// The ops need a GPU: a CPU build has none of them.
#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{Act, AdamStep, Keep};
    use candle_core::{Device, Result, Shape, Tensor};

    pub fn hash_mask(_: u64, _: f32, _: &Shape, _: &Device) -> Result<Tensor> {
        candle_core::bail!("hashed dropout masks are drawn on CUDA only")
    }
    pub fn dropout(_: &Tensor, _: u64, _: f32) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn layer_norm(_: &Tensor, _: &Tensor, _: &Tensor, _: f64) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn cross_entropy(_: &Tensor, _: &Tensor, _: usize) -> Result<Option<Tensor>> {
        Ok(None)
    }

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
        _: Option<(&Keep, f32)>,
        _: bool,
    ) -> Result<Option<(Tensor, Option<Tensor>)>> {
        Ok(None)
    }
    pub fn attn_softmax_bwd(
        _: &Tensor,
        _: &Tensor,
        _: f64,
        _: Option<(&Keep, f32)>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
    pub fn sum_squares(_: &Tensor) -> Result<Option<Tensor>> {
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
