//! BLOOM (BigScience, 2022, "BLOOM: A 176B-Parameter Open-Access Multilingual Language
//! Model"), matching HF transformers' `BloomForCausalLM` (inference).
//!
//! Shapes: `B` batch, `T` time, `H` hidden size, `nh` heads, `hs` head size, `V` vocab.
//!
//! Departures from GPT-2, all HF's:
//! - no position embeddings: ALiBi (Press et al., 2022) adds `slope_h · key_position` to the
//!   attention scores; positions come from the attention mask (cumsum − 1), so they stay right
//!   in padded batches;
//! - a LayerNorm right after the word embeddings (`word_embeddings_layernorm`);
//! - the fused `query_key_value` projection is laid out per head, (nh, 3, hs), not [q | k | v];
//! - projections are `nn.Linear` (weights (out, in)); the GELU is the tanh approximation;
//! - `apply_residual_connection_post_layernorm` takes the residual after the norm;
//! - attention softmax in fp32 whatever the model dtype (shared core does this).
//!
//! Decoding ([`CausalLm::forward_cached`]) reads earlier keys and values from a [`KvCache`],
//! which also keeps every key's ALiBi position.

use super::attention::{
    causal_padding_bias, causal_padding_bias_last, merge_heads, scaled_dot_product, WholeSequences,
};
use super::cache::{KvCache, LayerStep, Step};
use super::causal_lm::CausalLm;
use super::fp8::Fp8Weight;
use super::head::{fp8_lm_head, lm_head, split_head_logits};
use super::layers::{
    dropout, load_layer_norm, Activation, Dropout, Mlp, Mode, Norm, Projection, Unsummed,
    WeightLayout::Linear,
};
use super::norm_fold::{self, BlockSlots};
use super::step::{step_layer, StepKernel};
use crate::dist::Tp;
use crate::kernels::{self, QkvLayout};
use candle_core::{DType, Tensor, D};
use candle_nn::{Init, VarBuilder};

mod config;
pub use config::Config;

/// ALiBi slopes of `n_head` heads, as HF `build_alibi_tensor`: a geometric sequence for the
/// largest power of two ≤ n_head, then every other slope of the next power's sequence.
pub fn alibi_slopes(n_head: usize) -> Vec<f64> {
    let closest = 1usize << n_head.ilog2(); // 2^floor(log2(n_head))
    let base = 2f64.powf(-(2f64.powf(-((closest as f64).log2() - 3.))));
    let mut slopes: Vec<f64> = (1..=closest).map(|p| base.powi(p as i32)).collect();
    if closest != n_head {
        let extra_base = 2f64.powf(-(2f64.powf(-((2. * closest as f64).log2() - 3.))));
        let remaining = closest.min(n_head - closest);
        slopes.extend((0..remaining).map(|i| extra_base.powi(1 + 2 * i as i32)));
    }
    slopes
}

/// ALiBi bias, (B, nh, 1, T) f32: slope_h · position of key s, position = cumsum(mask) − 1 for
/// real tokens, 0 for padding (masked anyway). Broadcasts over queries: a per-query constant
/// shift would not change the softmax, so key position alone gives the relative bias.
fn alibi_bias(attention_mask: &Tensor, slopes: &Tensor) -> candle_core::Result<Tensor> {
    let mask = attention_mask.to_dtype(DType::F32)?;
    let pos = ((mask.cumsum(D::Minus1)? - 1.)? * &mask)?; // (B, T)
    alibi_at(&pos, slopes)
}

/// ALiBi bias of keys at `key_pos` (B, Tk) f32, (B, nh, 1, Tk): slope_h · key_pos[b, s]. Over
/// a KV cache the key positions are those the cache keeps, (cumsum(mask) − 1)·mask of every
/// cached and new position, as HF builds them from the whole mask at every decoding step.
fn alibi_at(key_pos: &Tensor, slopes: &Tensor) -> candle_core::Result<Tensor> {
    let (b, tk) = key_pos.dims2()?;
    let nh = slopes.dim(0)?;
    key_pos
        .reshape((b, 1, 1, tk))?
        .broadcast_mul(&slopes.reshape((1, nh, 1, 1))?)
}

/// Under tensor parallelism a rank holds `nh` of the heads: their `query_key_value` rows and
/// the matching `dense` columns.
struct Attention {
    query_key_value: Projection, // Linear (3H, H), output laid out (nh, 3, hs)
    dense: Projection,           // Linear (H, H)
    head_size: usize,
    scale: f64,
    slopes: Tensor, // (nh,) f32, this rank's heads (the decode kernel adds ALiBi itself)
}

impl Attention {
    fn load(vb: VarBuilder, cfg: &Config, tp: &Tp, slopes: &Tensor) -> candle_core::Result<Self> {
        let (h, std) = (cfg.hidden_size, cfg.initializer_range);
        Ok(Self {
            query_key_value: Projection::load(vb.pp("query_key_value"), Linear, h, 3 * h, std)?,
            dense: Projection::load(vb.pp("dense"), Linear, h, h, std)?.row_parallel(tp)?,
            head_size: h / cfg.n_head,
            scale: 1. / ((h / cfg.n_head) as f64).sqrt(),
            slopes: slopes.clone(),
        })
    }

    /// x: (B, T, H); bias: (B, nh, T, Tk) causal + padding + ALiBi of this rank's heads.
    /// With `kv`, the new keys and values go into the cache at the forward's start and the
    /// queries attend all Tk = start + T cached positions; without, Tk = T.
    /// Returns dense(attn), (B, T, H).
    fn forward(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let y = self.forward_unsummed(x, bias, kv, mode)?.sum()?;
        dropout(&y, mode.dropout.resid)
    }

    /// [`Attention::forward`] before dropout and the dense projection's sum over the ranks.
    fn forward_unsummed(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Unsummed> {
        let qkv = self.query_key_value.forward(x)?; // (B, T, nh·3·hs)
        self.dense
            .forward_unsummed(&self.attend(&qkv, bias, kv, mode)?) // (B, T, H)
    }

    /// The attention of qkv (B, T, nh·3·hs) before the dense projection, (B, T, nh·hs): a
    /// decode step's one query a row over the cache in one kernel, else the composed path
    /// under `bias`.
    fn attend(
        &self,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let hs = self.head_size;
        let nh = qkv.dim(2)? / (3 * hs);
        if let Some(kv) = kv.filter(|kv| kv.is_decode() && !mode.train) {
            let layout = QkvLayout {
                head_stride: 3 * hs,
                part: hs,
            };
            let slopes = Some(&self.slopes);
            let y =
                kernels::decode_attention(qkv, layout, (nh, hs), &kv.slot(), slopes, self.scale)?;
            if let Some(y) = y {
                return Ok(y); // (B, 1, nh·hs)
            }
            kv.check_kernel_served()?;
        }
        // Only a step the decode kernel must serve comes without one (LayerStep::check_kernel_served).
        let bias =
            bias.ok_or_else(|| candle_core::Error::Msg("attention needs its bias".into()))?;
        self.composed(qkv, bias, kv, mode)
    }

    /// [`Attention::forward_unsummed`] over whole right-padded sequences (scoring): one fused
    /// kernel where it applies (`--fused prefill`, ALiBi in it), else the composed path under
    /// the bias (causal + padding + ALiBi). With `kv` (a packed prefill) the keys and values
    /// go into the cache first.
    fn whole_unsummed(
        &self,
        x: &Tensor,
        whole: &WholeSequences,
        kv: Option<LayerStep>,
    ) -> candle_core::Result<Unsummed> {
        let hs = self.head_size;
        let qkv = self.query_key_value.forward(x)?; // (B, T, nh·3·hs)
        let nh = qkv.dim(2)? / (3 * hs);
        let layout = QkvLayout {
            head_stride: 3 * hs,
            part: hs,
        };
        let (rows, slopes) = (whole.rows(), Some(&self.slopes));
        if let Some(kv) = kv {
            kv.write_packed(&qkv, layout, (nh, hs), rows)?;
        }
        if let Some(y) = kernels::flash_prefill(&qkv, layout, (nh, hs), rows, slopes, self.scale)? {
            return self.dense.forward_unsummed(&y); // (B, T, nh·hs) -> (B, T, H)
        }
        let bias = whole.bias(|mask| {
            let causal = causal_padding_bias(mask)?; // (B, 1, T, T)
            causal.broadcast_add(&alibi_bias(mask, &self.slopes)?) // (B, nh, T, T)
        })?;
        let y = self.composed(&qkv, &bias, None, Mode::default())?;
        self.dense.forward_unsummed(&y)
    }

    /// The composed attention of qkv (B, T, nh·3·hs) under `bias`, (B, T, nh·hs) before the
    /// dense projection.
    fn composed(
        &self,
        qkv: &Tensor,
        bias: &Tensor,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let (b, t, _) = qkv.dims3()?;
        let hs = self.head_size;
        let nh = qkv.dim(2)? / (3 * hs);
        // Per head, not [q | k | v]: (B, T, nh, 3, hs).
        let qkv = qkv.reshape((b, t, nh, 3, hs))?;
        let head = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(3, i, 1)?
                .squeeze(3)? // (B, T, nh, hs)
                .transpose(1, 2)? // (B, nh, T, hs)
                .contiguous()
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let (k, v) = match kv {
            Some(kv) => kv.append(&k, &v)?, // (B, nh, Tk, hs)
            None => (k, v),
        };
        let y = scaled_dot_product(&q, &k, &v, bias, self.scale, mode)?; // (B, nh, T, hs)
        merge_heads(&y) // (B, T, nh·hs)
    }
}

fn load_mlp(vb: VarBuilder, cfg: &Config, tp: &Tp) -> candle_core::Result<Mlp> {
    let (h, std) = (cfg.hidden_size, cfg.initializer_range);
    Ok(Mlp {
        up: Projection::load(vb.pp("dense_h_to_4h"), Linear, h, 4 * h, std)?,
        down: Projection::load(vb.pp("dense_4h_to_h"), Linear, 4 * h, h, std)?.row_parallel(tp)?,
        act: Activation::GeluTanh, // bloom_gelu: 0.5x(1 + tanh(0.79788456 x (1 + 0.044715 x²)))
    })
}

struct Block {
    input_layernorm: Norm,
    self_attention: Attention,
    post_attention_layernorm: Norm,
    mlp: Mlp,
    residual_after_norm: bool,
}

impl Block {
    fn load(vb: VarBuilder, cfg: &Config, tp: &Tp, slopes: &Tensor) -> candle_core::Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.layer_norm_epsilon);
        Ok(Self {
            input_layernorm: load_layer_norm(vb.pp("input_layernorm"), h, eps)?,
            self_attention: Attention::load(vb.pp("self_attention"), cfg, tp, slopes)?,
            post_attention_layernorm: load_layer_norm(vb.pp("post_attention_layernorm"), h, eps)?,
            mlp: load_mlp(vb.pp("mlp"), cfg, tp)?,
            residual_after_norm: cfg.apply_residual_connection_post_layernorm,
        })
    }

    fn forward(&self, x: &Tensor, bias: &Tensor, mode: Mode) -> candle_core::Result<Tensor> {
        let ln = self.input_layernorm.forward(x, mode)?;
        let residual = if self.residual_after_norm { &ln } else { x };
        let x = (self.self_attention.forward(&ln, Some(bias), None, mode)? + residual)?;
        let ln = self.post_attention_layernorm.forward(&x, mode)?;
        let residual = if self.residual_after_norm { &ln } else { &x };
        dropout(&self.mlp.forward(&ln)?, mode.dropout.resid)? + residual
    }
}

/// `BloomForCausalLM`.
pub struct Bloom {
    word_embeddings: Tensor, // (V, H)
    word_embeddings_layernorm: Norm,
    h: Vec<Block>,
    ln_f: Norm,
    lm_head: Option<Tensor>, // (V, H) when not tied
    /// The LM head as fp8 (`--dtype fp8`), read in its place.
    head_fp8: Option<Fp8Weight>,
    slopes: Tensor, // (nh,) f32, this rank's heads
    head_size: usize,
    dropout: Dropout, // from the config, used in training mode
    mode: Mode,
    /// This rank's place, for the LM head split over the ranks when decoding.
    tp: Tp,
    /// The decode step's blocks as one kernel (`--fused step`).
    step: StepKernel,
    /// Every block's norms folded into its qkv and first MLP projection
    /// ([`CausalLm::fold_norms`]).
    norms_folded: bool,
}

impl Bloom {
    /// `transformer.word_embeddings.weight` (BloomForCausalLM) or without the prefix (BloomModel).
    pub const PREFIXES: &'static [&'static str] = &["transformer.", ""];

    /// Loads the model, or rank `tp.rank`'s shard of it: `vb` must then hand out that rank's
    /// slices ([`Config::tp_split`]); the rank's ALiBi slopes are those of its heads.
    pub fn load(vb: VarBuilder, cfg: &Config, tp: &Tp) -> candle_core::Result<Self> {
        cfg.validate().map_err(candle_core::Error::wrap)?;
        let (h, eps) = (cfg.hidden_size, cfg.layer_norm_epsilon);
        let std = Init::Randn {
            mean: 0.,
            stdev: cfg.initializer_range,
        };
        let word_embeddings =
            vb.pp("word_embeddings")
                .get_with_hints((cfg.vocab_size, h), "weight", std)?;
        let word_embeddings_layernorm =
            load_layer_norm(vb.pp("word_embeddings_layernorm"), h, eps)?;
        let slopes: Vec<f32> = alibi_slopes(cfg.n_head)[tp.part(cfg.n_head)]
            .iter()
            .map(|&s| s as f32)
            .collect();
        let slopes = Tensor::from_vec(slopes.clone(), slopes.len(), vb.device())?;
        let blocks = (0..cfg.n_layer)
            .map(|i| Block::load(vb.pp("h").pp(i), cfg, tp, &slopes))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let ln_f = load_layer_norm(vb.pp("ln_f"), h, eps)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(
                vb.pp("lm_head")
                    .get_with_hints((cfg.vocab_size, h), "weight", std)?,
            )
        };
        Ok(Self {
            word_embeddings,
            word_embeddings_layernorm,
            h: blocks,
            ln_f,
            lm_head,
            head_fp8: None,
            slopes,
            head_size: h / cfg.n_head,
            dropout: Dropout {
                embd: 0.,
                attn: cfg.attention_dropout,
                resid: cfg.hidden_dropout,
            },
            mode: Mode::default(),
            tp: tp.clone(),
            step: StepKernel::default(),
            norms_folded: false,
        })
    }
}

impl Bloom {
    /// The blocks and ln_f over the new positions x (B, T, H) of a cached forward; one new
    /// position a row attends the cache in one kernel.
    fn blocks_cached(
        &self,
        x: Tensor,
        cache: &KvCache,
        step: &Step,
    ) -> candle_core::Result<Tensor> {
        let built = || self.step_model();
        if let Some(h) = self
            .step
            .forward(|| Ok(x.clone()), cache, step, self.h.len(), built)?
        {
            return Ok(h);
        }
        let inference = Mode::default();
        // (B, nh, T, Tk) causal + padding + ALiBi; none for a step on the device (its shape
        // would be the capture's: the decode kernel adds ALiBi itself).
        let bias = match step.on_device() {
            true => None,
            false => {
                let causal = causal_padding_bias_last(&step.key_mask, step.t)?; // (B, 1, T, Tk)
                let alibi = alibi_at(&step.key_pos, &self.slopes)?; // (B, nh, 1, Tk)
                Some(causal.broadcast_add(&alibi)?)
            }
        };
        if let Some(h) = self.blocks_folded(&x, bias.as_ref(), cache, step)? {
            return Ok(h);
        }
        self.blocks_inference(x, |i, attn, h| {
            let kv = Some(cache.layer_step(i, step)?);
            attn.forward_unsummed(h, bias.as_ref(), kv, inference)
        })
    }

    /// [`Bloom::blocks_cached`] with the norms folded at rows that take them: qkv normalising its
    /// input, the attention, dense adding the residual, the MLP likewise; then ln_f. None where
    /// not folded or the kernels do not apply (the loop with the norms runs).
    fn blocks_folded(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        cache: &KvCache,
        step: &Step,
    ) -> candle_core::Result<Option<Tensor>> {
        let (b, t, h) = x.dims3()?;
        if !self.norms_folded || !norm_fold::folds(b * t, widest_folded(h)) {
            return Ok(None);
        }
        let mut x = x.clone(); // (B, T, H), the residual stream
        let slots = norm_fold::slots(cache.norm_stats(), self.h.len(), &x)?;
        for ((i, block), s) in self.h.iter().enumerate().zip(&slots) {
            let (a, s) = (&block.self_attention, s.as_ref());
            let eps = block.input_layernorm.eps();
            let Some(qkv) = a
                .query_key_value
                .forward_ln(&x, eps, None, s.map(BlockSlots::qkv))?
            else {
                match i {
                    0 => return Ok(None),
                    _ => candle_core::bail!("norm-fold: block {i}'s projection declined"),
                }
            };
            let kv = Some(cache.layer_step(i, step)?);
            let y = a.attend(&qkv, bias, kv, Mode::default())?; // (B, T, nh·hs)
            let x1 = a.dense.forward_add(&y, &x, s.map(BlockSlots::dense))?;
            let eps = block.post_attention_layernorm.eps();
            let (up, down) = (s.map(BlockSlots::up), s.and_then(BlockSlots::down));
            let Some(next) = block.mlp.forward_folded(&x1, eps, up, down)? else {
                candle_core::bail!("norm-fold: block {i}'s MLP projection did not apply");
            };
            x = next;
        }
        self.ln_f.forward_kernel(&x).map(Some)
    }

    /// The weights of [`Bloom::blocks_cached`]'s one kernel; None where it does not apply
    /// (the residual taken after the norm, tensor parallelism, fp8 weights).
    fn step_model(&self) -> candle_core::Result<Option<kernels::StepModel>> {
        let Some(lnf) = self.ln_f.parts() else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(self.h.len());
        for b in &self.h {
            let a = &b.self_attention;
            let (ln1, ln2) = (&b.input_layernorm, &b.post_attention_layernorm);
            let layer = match b.residual_after_norm {
                true => None,
                false => step_layer(ln1, &a.query_key_value, &a.dense, ln2, &b.mlp)?,
            };
            match layer {
                Some(l) => layers.push(l),
                None => return Ok(None),
            }
        }
        let hs = self.head_size;
        let attention = kernels::StepAttention {
            nh: self.slopes.dim(0)?,
            hs,
            layout: QkvLayout {
                head_stride: 3 * hs,
                part: hs,
            },
            scale: 1. / (hs as f64).sqrt(),
            slopes: Some(self.slopes.clone()),
        };
        kernels::StepModel::new(layers, lnf, self.ln_f.eps(), attention)
    }

    /// The normed embeddings of a cached forward's ids (B, T): (B, T, H); a decode step's
    /// (T = 1) in one kernel (`--fused step-io`), else the gather and the norm.
    fn embed_step(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if t == 1 {
            if let Some((w, bias)) = self.word_embeddings_layernorm.parts() {
                let norm = Some((&w, &bias, self.word_embeddings_layernorm.eps()));
                if let Some(x) = kernels::embed_rows(&self.word_embeddings, ids, None, norm)? {
                    return x.reshape((b, t, ()));
                }
            }
        }
        let x = self.word_embeddings.index_select(&ids.flatten_all()?, 0)?; // (B·T, H)
        self.word_embeddings_layernorm
            .forward(&x.reshape((b, t, ()))?, Mode::default())
    }

    /// The blocks and ln_f over sequences packed end to end, ids (N) or (1, N) ->
    /// (1, N, H); with `kv` (a packed prefill) each layer's keys and values go into the cache.
    /// No positions: the kernel adds ALiBi from each key's index in its sequence.
    fn blocks_packed(
        &self,
        ids: &Tensor,
        whole: &WholeSequences,
        kv: Option<(&KvCache, &Step)>,
    ) -> candle_core::Result<Tensor> {
        let n = ids.elem_count();
        let x = self.word_embeddings.index_select(&ids.flatten_all()?, 0)?; // (N, H)
        let x = self
            .word_embeddings_layernorm
            .forward(&x.reshape((1, n, ()))?, Mode::default())?; // (1, N, H)
        self.blocks_inference(x, |i, attn, h| {
            let kv = kv
                .map(|(cache, step)| cache.layer_step(i, step))
                .transpose()?;
            attn.whole_unsummed(h, whole, kv)
        })
    }

    /// The logits of each row's last hidden state, (B, H) -> (B, V); under tensor parallelism
    /// the head split over the ranks.
    fn last_logits(&self, last: &Tensor) -> candle_core::Result<Tensor> {
        let head = self.lm_head.as_ref().unwrap_or(&self.word_embeddings);
        if let Some(logits) = split_head_logits(last, head, &self.tp)? {
            return Ok(logits); // (B, V)
        }
        self.logits(last) // (B, V)
    }

    /// The blocks and ln_f of an inference forward from its normed embeddings x (B, T, H),
    /// `attend` giving layer i's attention branch of its normed input. Each residual add goes
    /// with the norm after it ([`Norm::add_forward`]: one kernel on CUDA).
    fn blocks_inference(
        &self,
        x: Tensor,
        attend: impl Fn(usize, &Attention, &Tensor) -> candle_core::Result<Unsummed>,
    ) -> candle_core::Result<Tensor> {
        let first = self.h.first().map_or(&self.ln_f, |b| &b.input_layernorm);
        let (mut x, mut h) = (x.clone(), first.forward(&x, Mode::default())?);
        for (i, block) in self.h.iter().enumerate() {
            // Each branch's sum over the ranks goes with the add and the norm after it.
            let a = attend(i, &block.self_attention, &h)?;
            let residual = if block.residual_after_norm { &h } else { &x };
            let (x1, h2) = block.post_attention_layernorm.add_unsummed(residual, a)?;
            let residual = if block.residual_after_norm { &h2 } else { &x1 };
            let m = block.mlp.forward_unsummed(&h2)?;
            let next = self.h.get(i + 1).map_or(&self.ln_f, |b| &b.input_layernorm);
            (x, h) = next.add_unsummed(residual, m)?;
        }
        Ok(h)
    }
}

impl CausalLm for Bloom {
    fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let x = self
            .word_embeddings
            .index_select(&input_ids.flatten_all()?, 0)?; // (B·T, H)
        let mut x = self
            .word_embeddings_layernorm
            .forward(&x.reshape((b, t, ()))?, self.mode)?; // (B, T, H)
        if !self.mode.train {
            let whole = WholeSequences::new(attention_mask)?;
            return self.blocks_inference(x, |_, attn, h| attn.whole_unsummed(h, &whole, None));
        }
        let causal = causal_padding_bias(attention_mask)?; // (B, 1, T, T)
        let bias = causal.broadcast_add(&alibi_bias(attention_mask, &self.slopes)?)?; // (B, nh, T, T)
        for block in &self.h {
            x = block.forward(&x, &bias, self.mode)?;
        }
        self.ln_f.forward(&x, self.mode)
    }

    fn hidden_states_packed(
        &self,
        input_ids: &Tensor,
        lens: &[usize],
    ) -> candle_core::Result<Option<Tensor>> {
        let (dtype, device) = (self.word_embeddings.dtype(), input_ids.device());
        if self.mode.train || !kernels::prefill_applies(dtype, device, self.head_size) {
            return Ok(None);
        }
        let whole = WholeSequences::packed(lens, device)?;
        Ok(Some(self.blocks_packed(input_ids, &whole, None)?))
    }

    fn prefill_packed(
        &self,
        input_ids: &Tensor,
        lens: &[usize],
        cache: &mut KvCache,
    ) -> candle_core::Result<Option<Tensor>> {
        let (dtype, device) = (self.word_embeddings.dtype(), input_ids.device());
        if !kernels::prefill_applies(dtype, device, self.head_size) {
            return Ok(None);
        }
        let Some(packed) = cache.packed_prompts(lens, input_ids.dim(1)?)? else {
            return Ok(None);
        };
        let step = cache.begin(&packed.mask, self.h.len())?;
        let ids = input_ids.flatten_all()?.index_select(&packed.gather, 0)?; // (N,)
        let whole = WholeSequences::packed(lens, device)?;
        let h = self.blocks_packed(&ids, &whole, Some((cache, &step)))?; // (1, N, H)
        cache.commit(step);
        let last = h.squeeze(0)?.index_select(&packed.last, 0)?; // (B, H)
        self.last_logits(&last).map(Some)
    }

    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(head) = &self.head_fp8 {
            return fp8_lm_head(hidden, head); // (N, V)
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.word_embeddings); // (V, H)
        lm_head(hidden, head) // (N, V)
    }

    fn new_cache(&self, batch: usize, max_len: usize) -> candle_core::Result<KvCache> {
        let shape = (self.slopes.dim(0)?, self.head_size);
        let (dtype, device) = (self.word_embeddings.dtype(), self.word_embeddings.device());
        let row_bytes = self.word_embeddings.dim(1)? * dtype.size_in_bytes();
        let slots = norm_fold::slots_for(self.norms_folded, batch, self.h.len(), row_bytes);
        KvCache::new(self.h.len(), batch, max_len, shape, dtype, device)?.with_norm_stats(slots)
    }

    fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> candle_core::Result<Tensor> {
        let t = input_ids.dim(1)?;
        let step = cache.begin(attention_mask, self.h.len())?;
        let x = self.embed_step(input_ids)?; // (B, T, H)
        let h = self.blocks_cached(x, cache, &step)?; // (B, T, H), after ln_f
        cache.commit(step);
        let last = h.narrow(1, t - 1, 1)?.squeeze(1)?.contiguous()?; // (B, H)
        self.last_logits(&last)
    }

    fn max_positions(&self) -> usize {
        Config::MAX_POSITIONS
    }

    fn graph_capturable(&self) -> bool {
        let projections = self
            .h
            .iter()
            .flat_map(|b| [&b.self_attention.dense, &b.mlp.down]);
        projections.into_iter().all(Projection::graph_capturable)
    }

    /// Folds each block's two LayerNorms into the projections after them ([`super::norm_fold`]),
    /// where it applies and every block takes it (the residual before the norm, 16-bit weights).
    fn fold_norms(&mut self, rows: usize) -> candle_core::Result<()> {
        let (dtype, device) = (self.word_embeddings.dtype(), self.word_embeddings.device());
        let hidden = self.word_embeddings.dim(1)?;
        let before = self.h.iter().all(|b| !b.residual_after_norm);
        let takes = norm_fold::folds(rows, widest_folded(hidden))
            && norm_fold::applies(dtype, hidden, device, &self.tp);
        if self.norms_folded || !before || !takes {
            return Ok(());
        }
        let mut all = true;
        for b in &mut self.h {
            let a = &mut b.self_attention;
            all &= b.input_layernorm.fold_into(&mut a.query_key_value)?;
            all &= b.post_attention_layernorm.fold_into(&mut b.mlp.up)?;
        }
        self.norms_folded = all;
        Ok(())
    }

    fn quantize_fp8(&mut self) -> candle_core::Result<()> {
        for b in &mut self.h {
            for p in [
                &mut b.self_attention.query_key_value,
                &mut b.self_attention.dense,
                &mut b.mlp.up,
                &mut b.mlp.down,
            ] {
                p.to_fp8()?;
            }
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.word_embeddings); // (V, C)
        self.head_fp8 = Some(Fp8Weight::quantize(head, None)?);
        Ok(())
    }

    fn set_training(&mut self, with_dropout: bool) {
        self.mode = Mode {
            train: true,
            dropout: if with_dropout {
                self.dropout
            } else {
                Dropout::default()
            },
        };
    }
}

/// Elements of the largest weight a norm folds into: the MLP's first, (4H, H).
fn widest_folded(hidden: usize) -> usize {
    4 * hidden * hidden
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_slopes_match_the_published_formula() {
        // Power of two: 2^(-8/n · k), k = 1..n.
        let s8 = alibi_slopes(8);
        for (k, s) in s8.iter().enumerate() {
            assert!((s - 2f64.powf(-(k as f64 + 1.))).abs() < 1e-12);
        }
        // Not a power of two (6 = 4 + 2): the 4-head slopes, then the odd-numbered slopes of
        // the 8-head sequence (2^-1, 2^-3).
        let s6 = alibi_slopes(6);
        assert_eq!(s6.len(), 6);
        assert_eq!(&s6[..4], &alibi_slopes(4)[..]);
        assert!((s6[4] - 0.5).abs() < 1e-12 && (s6[5] - 0.125).abs() < 1e-12);
        assert_eq!(alibi_slopes(112).len(), 112);
    }

    #[test]
    fn parameter_counts_match_the_published_models() {
        assert_eq!(Config::bloom_560m().n_parameters(), 559_214_592);
        assert_eq!(Config::bloom_7b1().n_parameters(), 7_069_016_064);
    }
}
