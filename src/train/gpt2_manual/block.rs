//! One GPT-2 block by hand: the forward, keeping what its backward reads, and the backward,
//! which returns the block's parameter gradients and the gradient of its input (the residual
//! stream's, to which the caller's carried gradient has been added).
//!
//! x_mid = x + drop(c_proj(attn(ln_1(x)))),  out = x_mid + drop(c_proj(act(c_fc(ln_2(x_mid)))))
//!
//! Shapes: `N` rows (B·T), `C` channels, `F` MLP hidden units; every activation is (N, ·).

use super::attention::{attention, attention_bwd, Kept};
use super::ops::{
    bias_act, bias_act_bwd, dropout, dropout_bwd, layer_norm, layer_norm_bwd, linear, linear_bwd,
    matmul_bwd,
};
use super::params::{Block, Linear, Norm};
use crate::kernels::Keep;
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
    /// The causal mask as an additive bias, (B, 1, T, T) f32.
    pub bias: Tensor,
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

/// The block's output (N, C) and its activations; `scale`: the layer's attention scale.
pub fn forward(p: &Block, x: Tensor, ctx: &Ctx, scale: f64) -> Result<(Tensor, Acts)> {
    let c = x.dim(1)?;
    let h1 = layer_norm(&x, &p.ln_1.weight, &p.ln_1.bias, ctx.eps)?;
    let qkv = linear(&h1, &p.c_attn.weight, &p.c_attn.bias)?; // (N, 3C)
    let qkv = qkv.reshape((ctx.batch, ctx.time, 3 * c))?;
    let (y, attn) = attention(&qkv, ctx.n_head, &ctx.bias, scale, ctx.dropout.attn)?;
    let proj = linear(&y, &p.attn_proj.weight, &p.attn_proj.bias)?;
    let (proj, drop_attn) = dropout(&proj, ctx.dropout.resid)?;
    let x_mid = (&x + proj)?;
    let h2 = layer_norm(&x_mid, &p.ln_2.weight, &p.ln_2.bias, ctx.eps)?;
    let fc = h2.matmul(&p.c_fc.weight)?; // (N, F)
    let a = bias_act(&fc, &p.c_fc.bias, Some(ctx.act))?;
    let mlp = linear(&a, &p.mlp_proj.weight, &p.mlp_proj.bias)?;
    let (mlp, drop_mlp) = dropout(&mlp, ctx.dropout.resid)?;
    let out = (&x_mid + mlp)?;
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
    let (da, dw, db) = linear_bwd(&acts.a, &p.mlp_proj.weight, &dmlp)?;
    let mlp_proj = Linear {
        weight: dw,
        bias: db,
    };
    let (dfc, dfc_bias) = bias_act_bwd(&acts.fc, &p.c_fc.bias, &da, ctx.act)?;
    let (dh2, dfc_w) = matmul_bwd(&acts.h2, &p.c_fc.weight, &dfc)?;
    let c_fc = Linear {
        weight: dfc_w,
        bias: dfc_bias,
    };
    let (dx_ln2, dw, db) = layer_norm_bwd(&acts.x_mid, &p.ln_2.weight, &dh2, ctx.eps)?;
    let ln_2 = Norm {
        weight: dw,
        bias: db,
    };
    let dx_mid = (dout + dx_ln2)?;
    // Attention branch; the residual passes dx_mid straight to x.
    let dproj = dropout_bwd(&dx_mid, &acts.drop_attn, p_resid)?;
    let (dy, dw, db) = linear_bwd(&acts.y, &p.attn_proj.weight, &dproj)?;
    let attn_proj = Linear {
        weight: dw,
        bias: db,
    };
    let dqkv = attention_bwd(&acts.attn, &dy, scale)?; // (N, 3C)
    let (dh1, dw, db) = linear_bwd(&acts.h1, &p.c_attn.weight, &dqkv)?;
    let c_attn = Linear {
        weight: dw,
        bias: db,
    };
    let (dx_ln1, dw, db) = layer_norm_bwd(&acts.x, &p.ln_1.weight, &dh1, ctx.eps)?;
    let ln_1 = Norm {
        weight: dw,
        bias: db,
    };
    let dx = (dx_mid + dx_ln1)?;
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
