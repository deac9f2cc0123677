//! The ops of the manual step, each forward beside its backward. Every one runs the fused
//! kernel where it applies (CUDA, `--fused`) and candle's ops otherwise: the CPU path, the same
//! maths as the composed ops the autograd path differentiates. Nothing here is tracked by
//! autograd (the weights are detached copies).
//!
//! Shapes: `N` rows (B·T tokens), `C` channels, `in` / `out` features, `B` batch, `T` time,
//! `nh` heads, `hs` head size.

use crate::kernels::{self, Act, Keep, ResidualGrads};
use crate::models::layers::Activation;
use candle_core::{DType, Result, Tensor, D};

/// a + b of one shape: the residual stream, and its gradient.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match kernels::residual_add(a, b)? {
        Some(sum) => Ok(sum),
        None => a + b,
    }
}

/// LayerNorm over the last dim, statistics in f32: x (N, C), w and b (C,) -> (N, C).
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    match kernels::layer_norm(x, w, b, eps)? {
        Some(y) => Ok(y),
        None => candle_nn::ops::layer_norm_slow(x, w, b, eps as f32),
    }
}

/// (dx (N, C), dw (C,) f32, db (C,) f32) of [`layer_norm`] from its input x and dy (N, C);
/// the statistics are recomputed from x. dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)), g = dy ⊙ w.
pub fn layer_norm_bwd(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    if let Some(grads) = kernels::layer_norm_bwd(x, w, dy, eps)? {
        return Ok(grads);
    }
    let (x32, dy32) = (x.to_dtype(DType::F32)?, dy.to_dtype(DType::F32)?);
    let c = x.dim(D::Minus1)? as f64;
    let xc = x32.broadcast_sub(&(x32.sum_keepdim(D::Minus1)? / c)?)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / c)?; // (N, 1)
    let rstd = (var + eps)?.sqrt()?.recip()?;
    let xhat = xc.broadcast_mul(&rstd)?;
    let dw = (&dy32 * &xhat)?.sum(0)?;
    let db = dy32.sum(0)?;
    let g = dy32.broadcast_mul(&w.to_dtype(DType::F32)?)?;
    let mean_g = (g.sum_keepdim(D::Minus1)? / c)?;
    let mean_gx = ((&g * &xhat)?.sum_keepdim(D::Minus1)? / c)?;
    let dx = (g.broadcast_sub(&mean_g)? - xhat.broadcast_mul(&mean_gx)?)?.broadcast_mul(&rstd)?;
    Ok((dx.to_dtype(x.dtype())?, dw, db))
}

/// [`layer_norm_bwd`] whose dx joins a residual stream's gradient `res` (like x): res + dx
/// (dx rounded to x's dtype before the add), dw, db, and Σ_rows res where the kernel summed
/// it. One kernel where the one-pass LayerNorm backward applies (CUDA), else the backward and
/// [`add`].
pub fn layer_norm_bwd_add(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    res: &Tensor,
    eps: f64,
) -> Result<ResidualGrads> {
    if let Some(grads) = kernels::layer_norm_bwd_add(x, w, dy, res, eps)? {
        return Ok(grads);
    }
    let (dx, dw, db) = layer_norm_bwd(x, w, dy, eps)?;
    Ok(ResidualGrads {
        dx: add(res, &dx)?,
        dw,
        db,
        res_sum: None,
    })
}

/// x in f32: one vectorised pass where the kernel applies (CUDA, `--fused adamw`'s multi-tensor
/// cast; candle's cast ran at a fifth of the bandwidth on the tied head's (V, C) gradient),
/// else candle's cast. A new buffer unless x is f32 already.
pub fn to_f32(x: &Tensor) -> Result<Tensor> {
    if x.dtype() == DType::F32 {
        return Ok(x.clone());
    }
    match kernels::cast_multi_flat(std::slice::from_ref(x), DType::F32)? {
        Some((flat, starts)) => flat
            .narrow(0, starts[0], x.elem_count())?
            .reshape(x.shape()),
        None => x.to_dtype(DType::F32),
    }
}

/// The gradient of a bias whose output gradient is dy (N, out): Σ_rows dy, as a kernel
/// already summed it (`summed`) or by the bias-gradient kernel (CUDA, f32), else in dy's dtype.
pub fn bias_grad(dy: &Tensor, summed: Option<Tensor>) -> Result<Tensor> {
    match summed {
        Some(db) => Ok(db),
        None => match kernels::bias_grad(dy)? {
            Some(db) => Ok(db),
            None => dy.sum(0),
        },
    }
}

/// x W + b with W (in, out) (GPT-2's Conv1D): x (N, in) -> (N, out). One cuBLASLt call with the
/// bias in its epilogue where it applies (CUDA, bf16/f16), else a matmul and the bias.
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    match kernels::linear(x, w, false, b, Act::None)? {
        Some(y) => Ok(y),
        None => bias_act(&x.matmul(w)?, b, None),
    }
}

/// (dx (N, in), dw (in, out), db (out,)) of [`linear`] from its input x and dy (N, out); db
/// in f32 from the bias-gradient kernel where it applies (CUDA), else in dy's dtype.
pub fn linear_bwd(x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (dx, dw) = matmul_bwd(x, w, dy)?;
    Ok((dx, dw, bias_grad(dy, None)?))
}

/// (dx (N, in), dw (in, out)) of x W from x (N, in) and dy (N, out).
pub fn matmul_bwd(x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let dx = dy.matmul(&w.t()?)?; // (N, out) @ (out, in)
    let dw = x.t()?.matmul(dy)?; // (in, N) @ (N, out)
    Ok((dx, dw))
}

/// act(x + b) (x + b without an activation): x (N, n), b (n,) -> (N, n).
pub fn bias_act(x: &Tensor, b: &Tensor, act: Option<Activation>) -> Result<Tensor> {
    let kact = act.map_or(Act::None, Activation::kernel);
    if let Some(y) = kernels::bias_act(x, b, kact)? {
        return Ok(y);
    }
    let y = x.broadcast_add(b)?;
    match act {
        Some(a) => a.forward(&y),
        None => Ok(y),
    }
}

/// (dx = dy ⊙ act'(x + b) (N, n), db = Σ_rows dx (n,)) of [`bias_act`] from its x and dy.
pub fn bias_act_bwd(
    x: &Tensor,
    b: &Tensor,
    dy: &Tensor,
    act: Activation,
) -> Result<(Tensor, Tensor)> {
    if let Some(grads) = kernels::bias_act_bwd(x, b, dy, act.kernel())? {
        return Ok(grads);
    }
    let dx = (dy * act_grad(act, &x.broadcast_add(b)?)?)?;
    let db = dx.sum(0)?;
    Ok((dx, db))
}

/// act'(h), the formulas of candle's autograd (with more digits for the tanh GELU).
fn act_grad(act: Activation, h: &Tensor) -> Result<Tensor> {
    match act {
        // gelu = 0.5·h·(1 + tanh u), u = √(2/π)·(h + 0.044715·h³)
        Activation::GeluTanh => {
            let cube = (h.sqr()? * h)?;
            let tanh = ((&cube * 0.035_677_408_136_3)? + (h * 0.797_884_560_802_9)?)?.tanh()?;
            let slope = ((&cube * 0.053_516_112_204_5)? + (h * 0.398_942_280_401_4)?)?;
            let one_minus_t2 = tanh.sqr()?.affine(-1., 1.)?;
            ((tanh * 0.5)? + (slope * one_minus_t2)?)? + 0.5
        }
        // Φ(h) + h·φ(h)
        Activation::GeluErf => {
            let pdf = (h.sqr()? * -0.5)?.exp()?;
            let cdf = ((h / std::f64::consts::SQRT_2)?.erf()? * 0.5)? + 0.5;
            cdf? + (pdf * h)?.affine(0.398_942_280_401_4, 0.)?
        }
        Activation::Relu => h.ge(&h.zeros_like()?)?.to_dtype(h.dtype()),
    }
}

/// Inverted dropout with a freshly drawn mask (hashed on CUDA with `--fused dropout`, the
/// draw the autograd path's `layers::dropout` makes at this point): x -> (y, the mask, or None
/// when p = 0).
pub fn dropout(x: &Tensor, p: f32) -> Result<(Tensor, Option<Keep>)> {
    if p <= 0. {
        return Ok((x.clone(), None));
    }
    let keep = kernels::draw_keep(x.shape(), p, x.device())?;
    Ok((kernels::apply_keep(x, &keep, p)?, Some(keep)))
}

/// x + dropout(branch) (a residual and its branch's dropout), with a mask drawn here or, with
/// `redraw`, the one an earlier forward drew (`--recompute`): (the sum, the mask). One fused
/// pass for a hashed mask on CUDA; else [`dropout`] then [`add`].
pub fn add_dropout(
    x: &Tensor,
    branch: &Tensor,
    p: f32,
    redraw: Option<&Option<Keep>>,
) -> Result<(Tensor, Option<Keep>)> {
    let keep = match redraw {
        Some(k) => k.clone(),
        None if p > 0. => Some(kernels::draw_keep(branch.shape(), p, branch.device())?),
        None => None,
    };
    let Some(k) = &keep else {
        return Ok((add(x, branch)?, None));
    };
    if let Some(sum) = kernels::residual_add_dropped(x, branch, k, p)? {
        return Ok((sum, keep));
    }
    Ok((add(x, &kernels::apply_keep(branch, k, p)?)?, keep))
}

/// The backward of a residual join and of [`add_dropout`]'s branch below it: (a + b, the
/// branch's gradient (a + b) ⊙ keep / (1 − p)), one fused pass for a hashed mask on CUDA.
pub fn add_then_dropout_bwd(
    a: &Tensor,
    b: &Tensor,
    keep: &Option<Keep>,
    p: f32,
) -> Result<(Tensor, Tensor)> {
    if let Some(k) = keep {
        if let Some(both) = kernels::residual_add_then_drop(a, b, k, p)? {
            return Ok(both);
        }
    }
    let sum = add(a, b)?;
    let dropped = dropout_bwd(&sum, keep, p)?;
    Ok((sum, dropped))
}

/// The backward of [`dropout`]: the same mask on the gradient.
pub fn dropout_bwd(dy: &Tensor, keep: &Option<Keep>, p: f32) -> Result<Tensor> {
    match keep {
        Some(k) => kernels::apply_keep(dy, k, p),
        None => Ok(dy.clone()),
    }
}
