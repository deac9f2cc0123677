//! Layers GPT-2 and BLOOM share: the two weight layouts of a projection, the GELU variants,
//! the two-projection MLP and layer-norm loading. Each model picks its checkpoint names.

use super::fp8::Fp8Weight;
use super::norm_fold;
use crate::dist::AllReduce;
use crate::dist::Tp;
use crate::error::{Error, Result};
use crate::kernels::{self, Act};
use candle_core::{DType, Tensor};
use candle_nn::{layer_norm, Init, LayerNormConfig, VarBuilder};
use std::borrow::Cow;
use std::sync::Arc;

/// How a projection's weight is stored in the checkpoint.
#[derive(Clone, Copy, Debug)]
pub enum WeightLayout {
    /// `nn.Linear`: (out, in); y = x Wᵀ + b (BLOOM).
    Linear,
    /// HF GPT-2's `Conv1D`: (in, out), the transpose of `nn.Linear`; y = x W + b.
    Conv1D,
}

/// A projection with bias, (B, T, in) -> (B, T, out). Under tensor parallelism the weight
/// is this rank's slice (see [`super::shard`]): column-parallel layers hold a slice of `out`
/// (and of the bias), row-parallel ones a slice of `in`, their partial outputs summed across
/// ranks before the (whole) bias is added.
pub struct Projection {
    weight: Stored,
    bias: Tensor, // (out,)
    layout: WeightLayout,
    /// Row-parallel: the sum over ranks.
    reduce: Option<Arc<dyn AllReduce>>,
    /// The LayerNorm before it folded in ([`Projection::fold_norm`]): (out, 2) f32, each row's
    /// Σ W and bias.
    folded: Option<Tensor>,
}

impl Projection {
    /// Loads `weight` (normal(0, `std`) for random init) and `bias` (zeros).
    pub fn load(
        vb: VarBuilder,
        layout: WeightLayout,
        n_in: usize,
        n_out: usize,
        std: f64,
    ) -> candle_core::Result<Self> {
        let shape = match layout {
            WeightLayout::Linear => (n_out, n_in),
            WeightLayout::Conv1D => (n_in, n_out),
        };
        let weight = vb.get_with_hints(
            shape,
            "weight",
            Init::Randn {
                mean: 0.,
                stdev: std,
            },
        )?;
        let bias = vb.get_with_hints(n_out, "bias", Init::Const(0.))?;
        Ok(Self {
            weight: Stored::Dense(weight),
            bias,
            layout,
            reduce: None,
            folded: None,
        })
    }

    /// Lays a Conv1D weight out as nn.Linear's, (in, out) -> (out, in): the same projection
    /// (the matmuls read either layout), and the decode GEMV's and tensor-core kernel's.
    /// Inference only.
    pub fn to_linear(&mut self) -> candle_core::Result<()> {
        if let (WeightLayout::Conv1D, Stored::Dense(w)) = (&self.layout, &self.weight) {
            self.weight = Stored::Dense(w.t()?.contiguous()?);
            self.layout = WeightLayout::Linear;
        }
        Ok(())
    }

    /// Stores the weight as fp8 ([`Fp8Weight`]), laid out as nn.Linear's (out, in), the bias
    /// beside the scales. Inference only; not under tensor parallelism.
    pub fn to_fp8(&mut self) -> candle_core::Result<()> {
        if self.reduce.is_some() {
            candle_core::bail!("fp8 weights under tensor parallelism are not built: drop --tp");
        }
        let Stored::Dense(w) = &self.weight else {
            return Ok(());
        };
        let w = match self.layout {
            WeightLayout::Linear => w.clone(),
            WeightLayout::Conv1D => w.t()?.contiguous()?, // (in, out) -> (out, in)
        };
        self.weight = Stored::Fp8(Fp8Weight::quantize(&w, Some(&self.bias))?);
        self.layout = WeightLayout::Linear;
        Ok(())
    }

    /// The weight in `dtype` as [`Projection::layout`] lays it out: as loaded, or an fp8
    /// weight turned back (out, in).
    fn dense(&self, dtype: DType) -> candle_core::Result<Cow<'_, Tensor>> {
        match &self.weight {
            Stored::Dense(w) => Ok(Cow::Borrowed(w)),
            Stored::Fp8(f) => Ok(Cow::Owned(f.dequantize(dtype)?)),
        }
    }

    /// Makes this a row-parallel projection of `tp` (its weight already holds the rank's rows).
    /// Rank 0 adds the bias to its partial output before the sum and the others add zeros, so
    /// each rank's matmul keeps the fused bias (the decode GEMV, cuBLASLt's epilogue) and no
    /// bias pass follows the sum.
    pub fn row_parallel(mut self, tp: &Tp) -> candle_core::Result<Self> {
        self.reduce = tp.reduce.clone();
        if tp.rank != 0 {
            self.bias = self.bias.zeros_like()?;
        }
        Ok(self)
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.forward_act(x, None)
    }

    /// The weight as nn.Linear lays it out, (out, in) contiguous (a copy of a Conv1D weight),
    /// and the bias; None for fp8 and row-parallel weights (the decode step kernel's input).
    pub fn linear_parts(&self) -> candle_core::Result<Option<(Tensor, Tensor)>> {
        let Stored::Dense(w) = &self.weight else {
            return Ok(None);
        };
        if self.reduce.is_some() {
            return Ok(None);
        }
        let w = match self.layout {
            WeightLayout::Linear => w.contiguous()?,
            WeightLayout::Conv1D => w.t()?.contiguous()?, // (in, out) -> (out, in)
        };
        Ok(Some((w, self.bias.clone())))
    }

    /// Whether a CUDA graph can record this projection: its all-reduce, if any, runs on the
    /// device (NCCL), not through the host.
    pub fn graph_capturable(&self) -> bool {
        self.reduce.as_ref().is_none_or(|r| r.on_device())
    }

    /// act(x W + b). On CUDA the bias and activation are fused ([`kernels`]): into the
    /// cuBLASLt matmul's epilogue for inference, one differentiable kernel after it for
    /// training and under tensor parallelism (the bias follows the all-reduce).
    pub fn forward_act(&self, x: &Tensor, act: Option<Activation>) -> candle_core::Result<Tensor> {
        if self.reduce.is_some() {
            // Row-parallel: the activation after the sum.
            let y = self.forward_unsummed(x)?.sum()?;
            return match act {
                Some(a) => a.forward(&y),
                None => Ok(y),
            };
        }
        let (b, t, c) = x.dims3()?;
        let x = x.reshape((b * t, c))?; // (B·T, in)
        let linear = matches!(self.layout, WeightLayout::Linear);
        let kact = act.map_or(Act::None, Activation::kernel);
        if let Stored::Fp8(f) = &self.weight {
            if let Some(y) = f.gemv(&x, kact)? {
                return y.reshape((b, t, ()));
            }
        }
        let w = self.dense(x.dtype())?;
        if let Some(y) = kernels::linear(&x, &w, linear, &self.bias, kact)? {
            return y.reshape((b, t, ()));
        }
        let y = self.matmul(&x, &w)?; // (B·T, out)
        let y = match kernels::bias_act(&y, &self.bias, kact)? {
            Some(y) => y,
            None => {
                let y = y.broadcast_add(&self.bias)?;
                match act {
                    Some(a) => a.forward(&y)?,
                    None => y,
                }
            }
        };
        y.reshape((b, t, ()))
    }
}

impl Projection {
    /// x W + b before a row-parallel projection's sum over the ranks, (B, T, in) -> (B, T,
    /// out): this rank's share, the (rank-0) bias in it, so each rank keeps the fused matmul.
    /// Not row-parallel: the whole output, nothing left to sum.
    pub fn forward_unsummed(&self, x: &Tensor) -> candle_core::Result<Unsummed> {
        let Some(reduce) = &self.reduce else {
            return Ok(Unsummed::whole(self.forward(x)?));
        };
        let (b, t, c) = x.dims3()?;
        let x = x.reshape((b * t, c))?; // (B·T, in)
        let reduce = Some(reduce.clone());
        if let (WeightLayout::Linear, Stored::Dense(w)) = (&self.layout, &self.weight) {
            // Run by the sum where it can push its output itself (Norm::add_unsummed).
            let (w, bias) = (w.clone(), self.bias.clone());
            let part = Part::Gemv { x, w, bias, b, t };
            return Ok(Unsummed { part, reduce });
        }
        let linear = matches!(self.layout, WeightLayout::Linear);
        let w = self.dense(x.dtype())?;
        let y = match kernels::linear(&x, &w, linear, &self.bias, Act::None)? {
            Some(y) => y,
            None => self.matmul(&x, &w)?.broadcast_add(&self.bias)?,
        }; // (B·T, out)
        let part = Part::Made(y.reshape((b, t, ()))?);
        Ok(Unsummed { part, reduce })
    }

    /// Folds the LayerNorm (γ, β) before this projection into its weight and bias
    /// ([`norm_fold`]); false, nothing changed, where it cannot hold it (fp8 or Conv1D
    /// weights, row-parallel). Inference only.
    pub fn fold_norm(&mut self, gamma: &Tensor, beta: &Tensor) -> candle_core::Result<bool> {
        let Stored::Dense(w) = &self.weight else {
            return Ok(false);
        };
        if !matches!(self.layout, WeightLayout::Linear) || self.reduce.is_some() {
            return Ok(false);
        }
        let f = norm_fold::fold(w, &self.bias, gamma, beta)?;
        (self.weight, self.bias, self.folded) = (Stored::Dense(f.w), f.b, Some(f.sb));
        Ok(true)
    }

    /// act(LN(x) W + b) for x (B, T, in) the residual stream before the LayerNorm this
    /// projection holds folded, in one launch: the GEMV at 1–4 rows ([`kernels::gemv_ln`], its
    /// statistics from `summed`'s slots where given), the tensor-core kernel at 5–16
    /// ([`kernels::skinny_ln`]); None where neither applies (nothing folded, the paths off).
    pub fn forward_ln(
        &self,
        x: &Tensor,
        eps: f64,
        act: Option<Activation>,
        summed: Option<kernels::Summed<'_>>,
    ) -> candle_core::Result<Option<Tensor>> {
        let (Some(sb), Stored::Dense(w)) = (&self.folded, &self.weight) else {
            return Ok(None);
        };
        let (b, t, c) = x.dims3()?;
        let kact = act.map_or(Act::None, Activation::kernel);
        let x = x.reshape((b * t, c))?;
        let y = match kernels::gemv_ln(&x, w, sb, kact, eps, summed)? {
            None => kernels::skinny_ln(&x, w, sb, kact, eps)?,
            y => y,
        }; // (B·T, out)
        y.map(|y| y.reshape((b, t, ()))).transpose()
    }

    /// x W + b + r for x (B, T, in) and r (B, T, out): the residual add in the epilogue of the
    /// GEMV at 1–4 rows ([`kernels::gemv_add`]) or the tensor-core kernel at 5–16
    /// ([`kernels::skinny_add`]), else the projection, then the add. With
    /// `stats` the GEMV also sums the output's statistics into those slots (`--fused
    /// norm-stats`): an error where it does not apply, since a folded GEMV will read them.
    pub fn forward_add(
        &self,
        x: &Tensor,
        r: &Tensor,
        stats: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let linear = matches!(self.layout, WeightLayout::Linear) && self.reduce.is_none();
        if let (Stored::Dense(w), true) = (&self.weight, linear) {
            let (b, t, c) = x.dims3()?;
            let (x2, r2) = (x.reshape((b * t, c))?, r.reshape((b * t, ()))?);
            if let Some(y) = kernels::gemv_add(&x2, w, &self.bias, &r2, stats)? {
                return y.reshape((b, t, ())); // (B, T, out)
            }
            let skinny = match stats {
                None => kernels::skinny_add(&x2, w, &self.bias, &r2)?,
                Some(_) => None, // a norm's slots: one row, the GEMV's
            };
            if let Some(y) = skinny {
                return y.reshape((b, t, ()));
            }
        }
        if stats.is_some() && kernels::enabled(kernels::Fused::NormStats) {
            candle_core::bail!(
                "norm-stats: a residual GEMV did not take the rows (to decode without it: --fused with every path but norm-stats)"
            );
        }
        self.forward(x)? + r
    }

    /// x W without the bias, `w` the weight as [`Projection::dense`] gives it: (B·T, in) ->
    /// (B·T, out).
    fn matmul(&self, x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
        match self.layout {
            WeightLayout::Linear => x.matmul(&w.t()?),
            WeightLayout::Conv1D => x.matmul(w),
        }
    }
}

/// A projection's weight: as loaded, or fp8 after [`Projection::to_fp8`].
enum Stored {
    Dense(Tensor),
    Fp8(Fp8Weight),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// tanh approximation: `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`, BLOOM's `bloom_gelu`.
    GeluTanh,
    /// exact erf GELU: `gelu`.
    GeluErf,
    Relu,
}

impl Activation {
    /// From an HF `activation_function` name.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Self::GeluTanh),
            "gelu" => Ok(Self::GeluErf),
            "relu" => Ok(Self::Relu),
            _ => Err(Error::Unsupported(format!(
                "activation_function '{name}' is not supported (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu)"
            ))),
        }
    }

    pub fn forward(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::GeluTanh => x.gelu(),
            Self::GeluErf => x.gelu_erf(),
            Self::Relu => x.relu(),
        }
    }

    /// The fused kernels' code for this activation.
    pub(crate) fn kernel(self) -> Act {
        match self {
            Self::GeluTanh => Act::GeluTanh,
            Self::GeluErf => Act::GeluErf,
            Self::Relu => Act::Relu,
        }
    }
}

/// down(act(up(x))): (B, T, C) -> (B, T, C).
pub struct Mlp {
    pub up: Projection,
    pub down: Projection,
    pub act: Activation,
}

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.down.forward(&self.up.forward_act(x, Some(self.act))?)
    }

    /// x + down(act(up(LN(x)))) with the LayerNorm folded into `up`
    /// ([`Projection::forward_ln`]): the norm's statistics in up's kernel (or from `summed`),
    /// the residual add in down's (summing the next norm's into `stats`). None where up's
    /// kernel does not apply.
    pub fn forward_folded(
        &self,
        x: &Tensor,
        eps: f64,
        summed: Option<kernels::Summed<'_>>,
        stats: Option<&Tensor>,
    ) -> candle_core::Result<Option<Tensor>> {
        let Some(h) = self.up.forward_ln(x, eps, Some(self.act), summed)? else {
            return Ok(None);
        };
        self.down.forward_add(&h, x, stats).map(Some)
    }

    /// [`Mlp::forward`] before the down projection's sum over the ranks.
    pub fn forward_unsummed(&self, x: &Tensor) -> candle_core::Result<Unsummed> {
        self.down
            .forward_unsummed(&self.up.forward_act(x, Some(self.act))?)
    }
}

/// Dropout probabilities of a model, from its config (HF names differ per model).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Dropout {
    /// After the embeddings (GPT-2 `embd_pdrop`).
    pub embd: f32,
    /// On the attention probabilities (GPT-2 `attn_pdrop`, BLOOM `attention_dropout`).
    pub attn: f32,
    /// On each residual branch's output (GPT-2 `resid_pdrop`, BLOOM `hidden_dropout`).
    pub resid: f32,
}

/// How a forward runs. Inference (the default): candle's fused layer-norm and softmax kernels,
/// which have no backward. Training: the same maths in differentiable ops, and `dropout` where
/// HF applies it (all zero for `--no-dropout`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Mode {
    pub train: bool,
    pub dropout: Dropout,
}

/// Inverted dropout (as torch): zero with probability `p`, scale the rest by 1/(1-p).
/// On CUDA one kernel each way with a hashed mask ([`kernels::dropout`]).
pub fn dropout(x: &Tensor, p: f32) -> candle_core::Result<Tensor> {
    if p <= 0. {
        return Ok(x.clone());
    }
    match kernels::dropout(x, p)? {
        Some(y) => Ok(y),
        None => candle_nn::ops::dropout(x, p),
    }
}

/// A LayerNorm with weight and bias; see [`Mode`] for the two forward paths.
pub struct Norm {
    ln: candle_nn::LayerNorm,
    eps: f64,
}

impl Norm {
    pub fn forward(&self, x: &Tensor, mode: Mode) -> candle_core::Result<Tensor> {
        use candle_core::Module;
        match (mode.train, self.ln.bias()) {
            // Same formula as the inference kernel, statistics in f32 for half inputs; on CUDA
            // one fused kernel with its backward.
            (true, Some(b)) => match kernels::layer_norm(x, self.ln.weight(), b, self.eps)? {
                Some(y) => Ok(y),
                None => candle_nn::ops::layer_norm_slow(x, self.ln.weight(), b, self.eps as f32),
            },
            _ => self.ln.forward(x),
        }
    }

    /// (weight, bias), (C,) each; None without a bias.
    pub fn parts(&self) -> Option<(Tensor, Tensor)> {
        let b = self.ln.bias()?;
        Some((self.ln.weight().clone(), b.clone()))
    }

    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// Folds this norm's weight and bias into `p`, the projection it feeds
    /// ([`Projection::fold_norm`]), and keeps the norm without them (γ = 1, β = 0): the same
    /// function on every path. False, nothing changed, where `p` cannot hold them.
    pub fn fold_into(&mut self, p: &mut Projection) -> candle_core::Result<bool> {
        let Some(beta) = self.ln.bias().cloned() else {
            return Ok(false);
        };
        let gamma = self.ln.weight().clone();
        if !p.fold_norm(&gamma, &beta)? {
            return Ok(false);
        }
        self.ln = candle_nn::LayerNorm::new(gamma.ones_like()?, beta.zeros_like()?, self.eps);
        Ok(true)
    }

    /// The norm of x (…, C) at inference in the fused kernel where it applies (one that a
    /// programmatic edge can start early), else [`Norm::forward`].
    pub fn forward_kernel(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(b) = self.ln.bias() {
            if let Some(y) = kernels::layer_norm(x, self.ln.weight(), b, self.eps)? {
                return Ok(y);
            }
        }
        self.forward(x, Mode::default())
    }

    /// (x + r, norm(x + r)), inference: the residual add and the next block's (or the final)
    /// norm; on CUDA one kernel (`--fused decode`), else the add, then [`Norm::forward`].
    pub fn add_forward(&self, x: &Tensor, r: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        if let Some(b) = self.ln.bias() {
            if let Some(out) = kernels::add_layer_norm(x, r, self.ln.weight(), b, self.eps)? {
                return Ok(out);
            }
        }
        let sum = (x + r)?;
        let normed = self.forward(&sum, Mode::default())?;
        Ok((sum, normed))
    }
}

/// A branch's output before the sum over the tensor-parallel ranks (Megatron's g): summed by
/// [`Unsummed::sum`], or with the residual add and the next norm in one pass by
/// [`Norm::add_unsummed`].
pub struct Unsummed {
    part: Part,
    reduce: Option<Arc<dyn AllReduce>>,
}

/// This rank's share of a branch's output, or the whole output where nothing is left to sum.
enum Part {
    /// (B, T, C).
    Made(Tensor),
    /// A row-parallel nn.Linear projection not yet run: x (B·T, in), w (out, in), bias (out,)
    /// (rank 0's, zeros elsewhere), to (B, T, out). Kept so that the sum can run its decode
    /// GEMV as one that pushes its output to the other ranks ([`AllReduce::gemv_sum_add_layer_norm`]).
    Gemv {
        x: Tensor,
        w: Tensor,
        bias: Tensor,
        b: usize,
        t: usize,
    },
}

impl Part {
    /// The output (B, T, C), running the projection if it has not run.
    fn made(self) -> candle_core::Result<Tensor> {
        let (x, w, bias, b, t) = match self {
            Part::Made(y) => return Ok(y),
            Part::Gemv { x, w, bias, b, t } => (x, w, bias, b, t),
        };
        let y = match kernels::linear(&x, &w, true, &bias, Act::None)? {
            Some(y) => y,
            None => x.matmul(&w.t()?)?.broadcast_add(&bias)?,
        }; // (B·T, out)
        y.reshape((b, t, ()))
    }

    fn pending(&self) -> Option<kernels::PendingGemv<'_>> {
        match self {
            Part::Gemv { x, w, bias, .. } => Some(kernels::PendingGemv { x, w, bias }),
            Part::Made(_) => None,
        }
    }
}

impl Unsummed {
    /// An output with nothing to sum.
    pub fn whole(y: Tensor) -> Self {
        Self {
            part: Part::Made(y),
            reduce: None,
        }
    }

    pub fn sum(self) -> candle_core::Result<Tensor> {
        let y = self.part.made()?;
        match &self.reduce {
            Some(reduce) => reduce.all_reduce_sum(&y),
            None => Ok(y),
        }
    }
}

impl Norm {
    /// [`Norm::add_forward`] of x and the sum of `r`: where the sum's backend has them (one-shot
    /// sums), the projection's GEMV pushing its output and one kernel for the sum, the add and
    /// the norm, or that kernel after the projection; else the sum, then the add + norm.
    pub fn add_unsummed(&self, x: &Tensor, r: Unsummed) -> candle_core::Result<(Tensor, Tensor)> {
        let (Some(reduce), Some(b)) = (&r.reduce, self.ln.bias()) else {
            return self.add_forward(x, &r.sum()?);
        };
        let norm = (self.ln.weight(), b, self.eps);
        if let Some(gemv) = r.part.pending() {
            if let Some(out) = reduce.gemv_sum_add_layer_norm(&gemv, x, norm)? {
                return Ok(out);
            }
        }
        let y = r.part.made()?;
        if let Some(out) = reduce.sum_add_layer_norm(&y, x, norm.0, norm.1, norm.2)? {
            return Ok(out);
        }
        self.add_forward(x, &reduce.all_reduce_sum(&y)?)
    }
}

/// `weight` (ones) and `bias` (zeros) of a LayerNorm over `size` channels.
pub fn load_layer_norm(vb: VarBuilder, size: usize, eps: f64) -> candle_core::Result<Norm> {
    let ln = layer_norm(
        size,
        LayerNormConfig {
            eps,
            ..Default::default()
        },
        vb,
    )?;
    Ok(Norm { ln, eps })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// A Conv1D projection laid out as nn.Linear's (`prepare_decode`) computes the same
    /// output, with and without the GELU, at decode and prefill row counts.
    #[test]
    fn a_conv1d_projection_as_linear_is_the_same_projection() {
        let dev = Device::Cpu;
        let mut map = std::collections::HashMap::new();
        map.insert(
            "weight".to_string(),
            Tensor::randn(0f32, 1., (6, 10), &dev).unwrap(),
        );
        map.insert(
            "bias".to_string(),
            Tensor::randn(0f32, 1., 10, &dev).unwrap(),
        );
        let vb = VarBuilder::from_tensors(map, DType::F32, &dev);
        let mut p = Projection::load(vb, WeightLayout::Conv1D, 6, 10, 0.02).unwrap();
        let xs = [(1, 1), (2, 5)].map(|(b, t)| Tensor::randn(0f32, 1., (b, t, 6), &dev).unwrap());
        let acts = [None, Some(Activation::GeluTanh)];
        let run = |p: &Projection| -> Vec<Tensor> {
            xs.iter()
                .flat_map(|x| acts.map(|a| p.forward_act(x, a).unwrap()))
                .collect()
        };
        let before = run(&p);
        p.to_linear().unwrap();
        assert!(matches!(p.layout, WeightLayout::Linear));
        for (a, b) in run(&p).iter().zip(&before) {
            let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            assert!(d.to_scalar::<f32>().unwrap() < 1e-5);
        }
    }
}
