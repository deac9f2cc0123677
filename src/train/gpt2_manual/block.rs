//! One GPT-2 block by hand: the forward, keeping what its backward reads, and the backward,
//! which returns the block's parameter gradients and the gradient of its input (the residual
//! stream's, to which the caller's carried gradient has been added).
//!
//! x_mid = x + drop(c_proj(attn(ln_1(x)))),  out = x_mid + drop(c_proj(act(c_fc(ln_2(x_mid)))))
//!
//! Shapes: `N` rows (B·T), `C` channels, `F` MLP hidden units; every activation is (N, ·).

use super::attention::{attention, attention_bwd, Kept, LazyBias};
use super::ops::{
    add_dropout, add_then_dropout_bwd, bias_act, bias_act_bwd, bias_grad, dropout_bwd, layer_norm,
    layer_norm_bwd, layer_norm_bwd_add, linear, linear_bwd, matmul_bwd,
};
use super::params::{Block, Linear, Norm};
use crate::kernels::{Keep, ResidualGrads};
use crate::models::layers::{Activation, Dropout};
use candle_core::{Result, Tensor};

/// What every block of a step shares.
pub struct Ctx {
    pub batch: usize,
    pub time: usize,
    pub n_head: usize,
    pub eps: f64,
    pub act: Activation,
    pub dropout: Dropout,
    /// The causal mask as an additive bias, (B, 1, T, T) f32, made at its first use: the
    /// composed attention reads it, the fused one applies the mask itself (0.15 ms a step
    /// for gpt2 at 8 × 1024 when made anyway).
    pub bias: LazyBias,
}

/// A block's activations, kept from its forward for its backward.
pub struct Acts {
    x: Tensor,  // (N, C) the input: ln_1's input
    h1: Tensor, // (N, C) ln_1(x): c_attn's input
    attn: Kept,
    y: Tensor, // (N, C) attention output, heads merged: attn.c_proj's input
    drop_attn: Option<Keep>,
    x_mid: Tensor, // (N, C) after the attention residual: ln_2's input
    h2: Tensor,    // (N, C) ln_2(x_mid): c_fc's input
    fc: Tensor,    // (N, F) h2 W_fc, before the bias and activation
    a: Tensor,     // (N, F) act(fc + b_fc): mlp.c_proj's input
    drop_mlp: Option<Keep>,
}

/// What `--recompute blocks` keeps of a block's forward: its input and the dropout masks it drew,
/// from which [`recompute`] rebuilds [`Acts`] for the backward.
pub struct Checkpoint {
    x: Tensor, // (N, C)
    masks: Masks,
}

/// What `--recompute mlp` keeps of a block's forward: all but h1 and the MLP's inner
/// activations (h2, fc, a), which [`recompute_mlp`] rebuilds from x and x_mid. 6 C a token
/// with the fused attention (x, qkv, y, x_mid) against [`Acts`]' 16 C.
pub struct AttentionHalf {
    x: Tensor,
    attn: Kept,
    y: Tensor,
    drop_attn: Option<Keep>,
    x_mid: Tensor,
    drop_mlp: Option<Keep>,
}

/// A block's three dropout masks (probabilities, attention residual, MLP residual).
struct Masks {
    attn: Option<Keep>,
    resid_attn: Option<Keep>,
    resid_mlp: Option<Keep>,
}

impl Acts {
    /// Everything but the input and the masks dropped: the block's memory until its backward
    /// is one (N, C) tensor (and the CPU's stored masks).
    pub fn checkpoint(self) -> Checkpoint {
        Checkpoint {
            masks: Masks {
                attn: self.attn.keep(),
                resid_attn: self.drop_attn,
                resid_mlp: self.drop_mlp,
            },
            x: self.x,
        }
    }

    /// h1, h2, fc and a dropped (they are made again from x and x_mid, the same ops on the
    /// same inputs: bit for bit what the forward made).
    pub fn attention_half(self) -> AttentionHalf {
        AttentionHalf {
            x: self.x,
            attn: self.attn,
            y: self.y,
            drop_attn: self.drop_attn,
            x_mid: self.x_mid,
            drop_mlp: self.drop_mlp,
        }
    }
}

/// The block's output (N, C) and its activations; `scale`: the layer's attention scale.
pub fn forward(p: &Block, x: Tensor, ctx: &Ctx, scale: f64) -> Result<(Tensor, Acts)> {
    forward_with(p, x, ctx, scale, None)
}

/// The activations of a checkpointed block's forward, run again with the same masks: equal
/// to what [`forward`] kept.
pub fn recompute(p: &Block, cp: Checkpoint, ctx: &Ctx, scale: f64) -> Result<Acts> {
    Ok(forward_with(p, cp.x, ctx, scale, Some(cp.masks))?.1)
}

/// The activations of a block that kept its attention half, its LayerNorms and the MLP's
/// first matmul and activation run again: equal to what [`forward`] kept.
pub fn recompute_mlp(p: &Block, half: AttentionHalf, ctx: &Ctx) -> Result<Acts> {
    let h1 = layer_norm(&half.x, &p.ln_1.weight, &p.ln_1.bias, ctx.eps)?;
    let (h2, fc, a) = mlp_inputs(p, &half.x_mid, ctx)?;
    Ok(Acts {
        x: half.x,
        h1,
        attn: half.attn,
        y: half.y,
        drop_attn: half.drop_attn,
        x_mid: half.x_mid,
        h2,
        fc,
        a,
        drop_mlp: half.drop_mlp,
    })
}

/// The MLP's activations before its output projection, from x_mid (N, C): (h2 = ln_2(x_mid)
/// (N, C), fc = h2 W_fc (N, F), a = act(fc + b_fc) (N, F)).
fn mlp_inputs(p: &Block, x_mid: &Tensor, ctx: &Ctx) -> Result<(Tensor, Tensor, Tensor)> {
    let h2 = layer_norm(x_mid, &p.ln_2.weight, &p.ln_2.bias, ctx.eps)?;
    let fc = h2.matmul(&p.c_fc.weight)?;
    let a = bias_act(&fc, &p.c_fc.bias, Some(ctx.act))?;
    Ok((h2, fc, a))
}

/// [`forward`], drawing the dropout masks, or with `masks` an earlier forward drew.
fn forward_with(
    p: &Block,
    x: Tensor,
    ctx: &Ctx,
    scale: f64,
    masks: Option<Masks>,
) -> Result<(Tensor, Acts)> {
    let c = x.dim(1)?;
    let p_resid = ctx.dropout.resid;
    let (redraw_attn, masks) = match masks {
        Some(m) => (Some(m.attn), Some((m.resid_attn, m.resid_mlp))),
        None => (None, None),
    };
    let h1 = layer_norm(&x, &p.ln_1.weight, &p.ln_1.bias, ctx.eps)?;
    let qkv = linear(&h1, &p.c_attn.weight, &p.c_attn.bias)?; // (N, 3C)
    let qkv = qkv.reshape((ctx.batch, ctx.time, 3 * c))?;
    let (y, attn) = attention(
        &qkv,
        ctx.n_head,
        &ctx.bias,
        scale,
        ctx.dropout.attn,
        redraw_attn,
    )?;
    let proj = linear(&y, &p.attn_proj.weight, &p.attn_proj.bias)?;
    let (x_mid, drop_attn) = add_dropout(&x, &proj, p_resid, masks.as_ref().map(|m| &m.0))?;
    let (h2, fc, a) = mlp_inputs(p, &x_mid, ctx)?;
    let mlp = linear(&a, &p.mlp_proj.weight, &p.mlp_proj.bias)?;
    let (out, drop_mlp) = add_dropout(&x_mid, &mlp, p_resid, masks.as_ref().map(|m| &m.1))?;
    let acts = Acts {
        x,
        h1,
        attn,
        y,
        drop_attn,
        x_mid,
        h2,
        fc,
        a,
        drop_mlp,
    };
    Ok((out, acts))
}

/// From `dout` (N, C), the gradient of the block's output: (the gradient of its input, every
/// parameter's gradient). Weights and biases of the projections in the compute dtype, the
/// LayerNorms' in f32.
pub fn backward(
    p: &Block,
    acts: Acts,
    dout: Tensor,
    ctx: &Ctx,
    scale: f64,
) -> Result<(Tensor, Block)> {
    let p_resid = ctx.dropout.resid;
    // MLP branch; the residual passes dout straight to x_mid.
    let dmlp = dropout_bwd(&dout, &acts.drop_mlp, p_resid)?;
    let (da, mlp_w) = matmul_bwd(&acts.a, &p.mlp_proj.weight, &dmlp)?;
    let (dfc, dfc_bias) = bias_act_bwd(&acts.fc, &p.c_fc.bias, &da, ctx.act)?;
    let (dh2, dfc_w) = matmul_bwd(&acts.h2, &p.c_fc.weight, &dfc)?;
    let c_fc = Linear {
        weight: dfc_w,
        bias: dfc_bias,
    };
    let (ln2, dproj) = mlp_join(p, &acts, &dh2, &dout, ctx)?; // ln2.dx = dx_mid
                                                              // mlp_proj's bias gradient is Σ dout where no dropout stands between: ln_2's kernel summed it.
    let summed = acts.drop_mlp.is_none().then_some(ln2.res_sum).flatten();
    let mlp_proj = Linear {
        weight: mlp_w,
        bias: bias_grad(&dmlp, summed)?,
    };
    let ln_2 = Norm {
        weight: ln2.dw,
        bias: ln2.db,
    };
    // Attention branch; the residual passes dx_mid straight to x.
    let (dy, attn_w) = matmul_bwd(&acts.y, &p.attn_proj.weight, &dproj)?;
    let dqkv = attention_bwd(&acts.attn, &dy, scale)?; // (N, 3C)
    let (dh1, dw, db) = linear_bwd(&acts.h1, &p.c_attn.weight, &dqkv)?;
    let c_attn = Linear {
        weight: dw,
        bias: db,
    };
    let ln1 = layer_norm_bwd_add(&acts.x, &p.ln_1.weight, &dh1, &ln2.dx, ctx.eps)?;
    // attn_proj's bias gradient is Σ dx_mid without the attention branch's dropout: ln_1's
    // kernel summed it.
    let summed = acts.drop_attn.is_none().then_some(ln1.res_sum).flatten();
    let attn_proj = Linear {
        weight: attn_w,
        bias: bias_grad(&dproj, summed)?,
    };
    let ln_1 = Norm {
        weight: ln1.dw,
        bias: ln1.db,
    };
    let dx = ln1.dx;
    let grads = Block {
        ln_1,
        c_attn,
        attn_proj,
        ln_2,
        c_fc,
        mlp_proj,
    };
    Ok((dx, grads))
}

/// ln_2's backward joined with the residual: (its grads, dx_mid = dout + ln_2's dx among them,
/// and the attention projection's output gradient: dx_mid, or dx_mid through the branch's
/// dropout, whose backward is fused with the add instead).
fn mlp_join(
    p: &Block,
    acts: &Acts,
    dh2: &Tensor,
    dout: &Tensor,
    ctx: &Ctx,
) -> Result<(ResidualGrads, Tensor)> {
    let (x_mid, w) = (&acts.x_mid, &p.ln_2.weight);
    if acts.drop_attn.is_none() {
        let grads = layer_norm_bwd_add(x_mid, w, dh2, dout, ctx.eps)?;
        let dproj = grads.dx.clone();
        return Ok((grads, dproj));
    }
    let (dx_ln2, dw, db) = layer_norm_bwd(x_mid, w, dh2, ctx.eps)?;
    let (dx, dproj) = add_then_dropout_bwd(dout, &dx_ln2, &acts.drop_attn, ctx.dropout.resid)?;
    let res_sum = None;
    Ok((
        ResidualGrads {
            dx,
            dw,
            db,
            res_sum,
        },
        dproj,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn randn(shape: &[usize], seed: f64) -> Tensor {
        // A fixed pattern, not the RNG: the test compares two forwards of the same inputs.
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f64 * 0.37 + seed).sin() * 0.2) as f32)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// A block of random weights (C = 8, F = 16) and its context: B = 2, T = 5, two heads,
    /// dropout 0.3 on the probabilities and both residuals.
    fn block_and_ctx() -> (Block, Ctx) {
        let (b, t, c, f) = (2, 5, 8, 16);
        let norm = |s| Norm {
            weight: (randn(&[c], s) + 1.).unwrap(),
            bias: randn(&[c], s + 1.),
        };
        let lin = |i, o, s| Linear {
            weight: randn(&[i, o], s),
            bias: randn(&[o], s + 2.),
        };
        let p = Block {
            ln_1: norm(1.),
            c_attn: lin(c, 3 * c, 2.),
            attn_proj: lin(c, c, 3.),
            ln_2: norm(4.),
            c_fc: lin(c, f, 5.),
            mlp_proj: lin(f, c, 6.),
        };
        let ctx = Ctx {
            batch: b,
            time: t,
            n_head: 2,
            eps: 1e-5,
            act: Activation::GeluTanh,
            dropout: Dropout {
                embd: 0.,
                attn: 0.3,
                resid: 0.3,
            },
            bias: LazyBias::new(b, t, &Device::Cpu),
        };
        (p, ctx)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        d.to_scalar::<f32>().unwrap()
    }

    /// With dropout on (the CPU's stored masks), a checkpointed block's recomputed activations
    /// are the first forward's exactly: the masks are reused, not drawn again.
    #[test]
    fn recompute_reuses_the_dropout_masks() {
        let (p, ctx) = block_and_ctx();
        let x = randn(&[10, 8], 7.);
        let (out, acts) = forward(&p, x, &ctx, 0.5).unwrap();
        let kept = [&acts.y, &acts.x_mid, &acts.a].map(|t| t.clone());
        let again = recompute(&p, acts.checkpoint(), &ctx, 0.5).unwrap();
        let mlp = linear(&again.a, &p.mlp_proj.weight, &p.mlp_proj.bias).unwrap();
        let (out_again, _) = add_dropout(&again.x_mid, &mlp, 0.3, Some(&again.drop_mlp)).unwrap();
        for (k, a) in kept.iter().zip([&again.y, &again.x_mid, &again.a]) {
            assert_eq!(max_diff(k, a), 0.);
        }
        assert_eq!(max_diff(&out, &out_again), 0.);
    }

    /// `--recompute mlp`, dropout on: the activations it drops (h1, h2, fc, a), made again,
    /// are the forward's exactly (the rest it keeps; the step's gradients: tests.rs).
    #[test]
    fn recompute_mlp_rebuilds_what_it_dropped() {
        let (p, ctx) = block_and_ctx();
        let (_, acts) = forward(&p, randn(&[10, 8], 7.), &ctx, 0.5).unwrap();
        let dropped = [&acts.h1, &acts.h2, &acts.fc, &acts.a].map(|t| t.clone());
        let again = recompute_mlp(&p, acts.attention_half(), &ctx).unwrap();
        for (k, a) in dropped
            .iter()
            .zip([&again.h1, &again.h2, &again.fc, &again.a])
        {
            assert_eq!(max_diff(k, a), 0.);
        }
    }
}
