//! GPT-2 (Radford et al., 2019, "Language Models are Unsupervised Multitask Learners"),
//! matching HF transformers' `GPT2LMHeadModel` (eager attention, inference).
//!
//! Shapes: `B` batch, `T` time, `C` channels (n_embd), `nh` heads, `hs` head size, `V` vocab.
//!
//! Departures from a textbook transformer, all HF's:
//! - learned absolute position embeddings (`wpe`), added to the token embeddings (`wte`);
//! - projections are `Conv1D`: the weight is stored (in, out), the transpose of `nn.Linear`;
//! - the MLP activation is `gelu_new`, the tanh approximation of GELU;
//! - pre-norm blocks, a final `ln_f`, and the LM head tied to `wte`.
//!
//! Decoding ([`CausalLm::forward_cached`]) reads earlier keys and values from a [`KvCache`];
//! position ids come from the attention mask, as HF `generate` makes them for left padding.

use super::attention::{
    causal_padding_bias, merge_heads, positions, scaled_dot_product, split_heads, WholeSequences,
};
use super::cache::{KvCache, LayerStep, Step};
use super::causal_lm::CausalLm;
use super::fp8::Fp8Weight;
use super::head::{fp8_lm_head, lm_head, split_head_logits};
use super::layers::{
    dropout, load_layer_norm, Activation, Dropout, Mlp, Mode, Norm, Projection, Unsummed,
    WeightLayout::Conv1D,
};
use super::norm_fold::{self, BlockSlots};
use super::step::{step_layer, StepKernel};
use crate::dist::Tp;
use crate::kernels::{self, QkvLayout};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarBuilder};

mod config;
pub use config::Config;

/// Under tensor parallelism a rank holds some of the heads: `c_attn` (C, 3·c) with c = its
/// heads × hs, and `c_proj`'s matching (c, C) rows.
struct Attention {
    c_attn: Projection, // Conv1D (C, 3C): [q | k | v]
    c_proj: Projection, // Conv1D (C, C)
    head_size: usize,
    scale: f64,
}

impl Attention {
    fn load(vb: VarBuilder, cfg: &Config, layer_idx: usize, tp: &Tp) -> candle_core::Result<Self> {
        let c = cfg.n_embd;
        // HF scales residual projections' init by 1/sqrt(2·n_layer) (GPT-2 paper, 2.3).
        let proj_std = cfg.initializer_range / (2. * cfg.n_layer as f64).sqrt();
        let scale = cfg.attn_scale(layer_idx);
        Ok(Self {
            c_attn: Projection::load(vb.pp("c_attn"), Conv1D, c, 3 * c, cfg.initializer_range)?,
            c_proj: Projection::load(vb.pp("c_proj"), Conv1D, c, c, proj_std)?.row_parallel(tp)?,
            head_size: c / cfg.n_head,
            scale,
        })
    }

    /// x: (B, T, C), bias: (B, 1, T, Tk) -> (B, T, C). With `kv`, the new keys and values go
    /// into the cache at the forward's start and the queries attend all Tk = start + T cached
    /// positions; without, Tk = T.
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

    /// [`Attention::forward`] before dropout and c_proj's sum over the ranks.
    fn forward_unsummed(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Unsummed> {
        let qkv = self.c_attn.forward(x)?; // (B, T, 3c), c = C without tensor parallelism
        self.c_proj
            .forward_unsummed(&self.attend(&qkv, bias, kv, mode)?) // (B, T, C)
    }

    /// The attention of qkv (B, T, 3c) before c_proj, (B, T, c): a decode step's one query a
    /// row over the cache in one kernel, else the composed path under `bias`.
    fn attend(
        &self,
        qkv: &Tensor,
        bias: Option<&Tensor>,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let c = qkv.dim(2)? / 3;
        let nh = c / self.head_size;
        if let Some(kv) = kv.filter(|kv| kv.is_decode() && !mode.train) {
            let layout = QkvLayout {
                head_stride: self.head_size,
                part: c,
            };
            let hs = self.head_size;
            let y = kernels::decode_attention(qkv, layout, (nh, hs), &kv.slot(), None, self.scale)?;
            if let Some(y) = y {
                return Ok(y); // (B, 1, c)
            }
            kv.check_kernel_served()?;
        }
        // Only a step the decode kernel must serve comes without one (LayerStep::check_kernel_served).
        let bias =
            bias.ok_or_else(|| candle_core::Error::Msg("attention needs its bias".into()))?;
        self.composed(qkv, bias, kv, mode)
    }

    /// [`Attention::forward_unsummed`] over whole right-padded sequences (scoring): one fused
    /// kernel where it applies (`--fused prefill`), else the composed path under the bias.
    /// With `kv` (a packed prefill) the keys and values go into the cache first.
    fn whole_unsummed(
        &self,
        x: &Tensor,
        whole: &WholeSequences,
        kv: Option<LayerStep>,
    ) -> candle_core::Result<Unsummed> {
        let qkv = self.c_attn.forward(x)?; // (B, T, 3c)
        let (c, hs) = (qkv.dim(2)? / 3, self.head_size);
        let layout = QkvLayout {
            head_stride: hs,
            part: c,
        };
        let rows = whole.rows();
        if let Some(kv) = kv {
            kv.write_packed(&qkv, layout, (c / hs, hs), rows)?;
        }
        if let Some(y) = kernels::flash_prefill(&qkv, layout, (c / hs, hs), rows, None, self.scale)?
        {
            return self.c_proj.forward_unsummed(&y); // (B, T, c) -> (B, T, C)
        }
        let bias = whole.bias(causal_padding_bias)?; // (B, 1, T, T)
        let y = self.composed(&qkv, &bias, None, Mode::default())?;
        self.c_proj.forward_unsummed(&y)
    }

    /// The composed attention of qkv (B, T, 3c) under `bias`, (B, T, c) before c_proj.
    fn composed(
        &self,
        qkv: &Tensor,
        bias: &Tensor,
        kv: Option<LayerStep>,
        mode: Mode,
    ) -> candle_core::Result<Tensor> {
        let c = qkv.dim(2)? / 3;
        let nh = c / self.head_size;
        let q = split_heads(&qkv.narrow(2, 0, c)?, nh)?; // (B, nh, T, hs)
        let k = split_heads(&qkv.narrow(2, c, c)?, nh)?;
        let v = split_heads(&qkv.narrow(2, 2 * c, c)?, nh)?;
        let (k, v) = match kv {
            Some(kv) => kv.append(&k, &v)?, // (B, nh, Tk, hs)
            None => (k, v),
        };
        let y = scaled_dot_product(&q, &k, &v, bias, self.scale, mode)?; // (B, nh, T, hs)
        merge_heads(&y) // (B, T, c)
    }
}

/// `c_fc` and `c_proj` of GPT-2's MLP, both `Conv1D`.
fn load_mlp(vb: VarBuilder, cfg: &Config, tp: &Tp) -> candle_core::Result<Mlp> {
    let proj_std = cfg.initializer_range / (2. * cfg.n_layer as f64).sqrt();
    let act = Activation::parse(&cfg.activation_function).map_err(candle_core::Error::wrap)?;
    Ok(Mlp {
        up: Projection::load(
            vb.pp("c_fc"),
            Conv1D,
            cfg.n_embd,
            cfg.n_inner(),
            cfg.initializer_range,
        )?,
        down: Projection::load(vb.pp("c_proj"), Conv1D, cfg.n_inner(), cfg.n_embd, proj_std)?
            .row_parallel(tp)?,
        act,
    })
}

struct Block {
    ln_1: Norm,
    attn: Attention,
    ln_2: Norm,
    mlp: Mlp,
}

impl Block {
    /// The block's four projections (fp8 quantization and the decode layout change them all).
    fn projections(&mut self) -> [&mut Projection; 4] {
        [
            &mut self.attn.c_attn,
            &mut self.attn.c_proj,
            &mut self.mlp.up,
            &mut self.mlp.down,
        ]
    }

    fn load(vb: VarBuilder, cfg: &Config, layer_idx: usize, tp: &Tp) -> candle_core::Result<Self> {
        let eps = cfg.layer_norm_epsilon;
        Ok(Self {
            ln_1: load_layer_norm(vb.pp("ln_1"), cfg.n_embd, eps)?,
            attn: Attention::load(vb.pp("attn"), cfg, layer_idx, tp)?,
            ln_2: load_layer_norm(vb.pp("ln_2"), cfg.n_embd, eps)?,
            mlp: load_mlp(vb.pp("mlp"), cfg, tp)?,
        })
    }

    fn forward(&self, x: &Tensor, bias: &Tensor, mode: Mode) -> candle_core::Result<Tensor> {
        let x = (x + self
            .attn
            .forward(&self.ln_1.forward(x, mode)?, Some(bias), None, mode)?)?;
        let mlp = self.mlp.forward(&self.ln_2.forward(&x, mode)?)?;
        &x + dropout(&mlp, mode.dropout.resid)?
    }
}

/// `GPT2LMHeadModel`.
pub struct Gpt2 {
    wte: Tensor, // (V, C)
    wpe: Tensor, // (n_positions, C)
    h: Vec<Block>,
    ln_f: Norm,
    lm_head: Option<Tensor>, // (V, C) when not tied to wte
    /// The LM head as fp8 (`--dtype fp8`), read in its place.
    head_fp8: Option<Fp8Weight>,
    cfg: Config,
    /// Heads this rank computes (all of them without tensor parallelism).
    local_heads: usize,
    mode: Mode,
    /// This rank's place, for the LM head split over the ranks when decoding.
    tp: Tp,
    /// The decode step's blocks as one kernel (`--fused step`).
    step: StepKernel,
    /// Every block's norms folded into its c_attn and c_fc ([`CausalLm::fold_norms`]).
    norms_folded: bool,
}

impl Gpt2 {
    /// Checkpoint names are `wte.weight`, `h.0.attn.c_attn.weight`, … with or without a
    /// `transformer.` prefix (GPT2LMHeadModel vs GPT2Model checkpoints).
    pub const PREFIXES: &'static [&'static str] = &["transformer.", ""];

    /// Loads the model, or rank `tp.rank`'s shard of it: `vb` must then hand out that rank's
    /// slices ([`Config::tp_split`]).
    pub fn load(vb: VarBuilder, cfg: &Config, tp: &Tp) -> candle_core::Result<Self> {
        cfg.validate().map_err(candle_core::Error::wrap)?;
        let std = Init::Randn {
            mean: 0.,
            stdev: cfg.initializer_range,
        };
        let wte = vb
            .pp("wte")
            .get_with_hints((cfg.vocab_size, cfg.n_embd), "weight", std)?;
        let wpe = vb
            .pp("wpe")
            .get_with_hints((cfg.n_positions, cfg.n_embd), "weight", std)?;
        let h = (0..cfg.n_layer)
            .map(|i| Block::load(vb.pp("h").pp(i), cfg, i, tp))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let ln_f = load_layer_norm(vb.pp("ln_f"), cfg.n_embd, cfg.layer_norm_epsilon)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(
                vb.pp("lm_head")
                    .get_with_hints((cfg.vocab_size, cfg.n_embd), "weight", std)?,
            )
        };
        Ok(Self {
            wte,
            wpe,
            h,
            ln_f,
            lm_head,
            head_fp8: None,
            cfg: cfg.clone(),
            local_heads: tp.part(cfg.n_head).len(),
            mode: Mode::default(),
            tp: tp.clone(),
            step: StepKernel::default(),
            norms_folded: false,
        })
    }

    /// The blocks and ln_f over the new positions of a cached forward, from their token and
    /// position embeddings (B, T, C) each; one new position a row attends the cache in one
    /// kernel.
    fn blocks_cached(
        &self,
        embeddings: (Tensor, Tensor),
        cache: &KvCache,
        step: &Step,
    ) -> candle_core::Result<Tensor> {
        let (tok, pos) = &embeddings;
        let x = || tok + pos; // (B, 1, C)
        let built = || self.step_model();
        if let Some(h) = self.step.forward(x, cache, step, self.h.len(), built)? {
            return Ok(h);
        }
        let inference = Mode::default();
        let bias = step.causal_padding_bias()?;
        let rows = tok.dims()[..2].iter().product::<usize>();
        if self.norms_folded && norm_fold::folds(rows, self.widest_folded()) {
            if let Some(h) = self.blocks_folded((tok + pos)?, bias.as_ref(), cache, step)? {
                return Ok(h);
            }
        }
        self.blocks_inference(embeddings, |i, attn, h| {
            let kv = Some(cache.layer_step(i, step)?);
            attn.forward_unsummed(h, bias.as_ref(), kv, inference)
        })
    }

    /// A cached forward of rows that take the folded norms ([`norm_fold::folds`]) from the ids:
    /// the token + position sum in one kernel (`--fused step-io`), then [`Gpt2::blocks_folded`].
    /// None where not folded, `step` is on, or the kernel does not apply (blocks_cached runs).
    fn folded_from_ids(
        &self,
        ids: &Tensor,
        cache: &KvCache,
        step: &Step,
    ) -> candle_core::Result<Option<Tensor>> {
        let (b, t) = ids.dims2()?;
        let folds = self.norms_folded && norm_fold::folds(b * t, self.widest_folded());
        if !folds || kernels::enabled(kernels::Fused::Step) {
            return Ok(None);
        }
        let table = Some((&self.wpe, &step.positions));
        let Some(x) = kernels::embed_rows(&self.wte, ids, table, None)? else {
            return Ok(None);
        };
        let x = x.reshape((b, t, ()))?; // (B, T, C)
        self.blocks_folded(x, step.causal_padding_bias()?.as_ref(), cache, step)
    }

    /// [`Gpt2::blocks_cached`] with the norms folded, from the residual stream x (B, T, C):
    /// c_attn normalising its input, the attention, c_proj adding the residual, the MLP likewise;
    /// then ln_f. None where the kernels do not apply (the loop with the norms runs).
    fn blocks_folded(
        &self,
        mut x: Tensor,
        bias: Option<&Tensor>,
        cache: &KvCache,
        step: &Step,
    ) -> candle_core::Result<Option<Tensor>> {
        let slots = norm_fold::slots(cache.norm_stats(), self.h.len(), &x)?;
        for ((i, block), s) in self.h.iter().enumerate().zip(&slots) {
            let (attn, s) = (&block.attn, s.as_ref());
            let qkv = attn
                .c_attn
                .forward_ln(&x, block.ln_1.eps(), None, s.map(BlockSlots::qkv))?;
            let Some(qkv) = qkv else {
                match i {
                    0 => return Ok(None),
                    _ => candle_core::bail!("norm-fold: block {i}'s projection declined"),
                }
            };
            let kv = Some(cache.layer_step(i, step)?);
            let y = attn.attend(&qkv, bias, kv, Mode::default())?; // (B, T, C)
            let x1 = attn.c_proj.forward_add(&y, &x, s.map(BlockSlots::dense))?;
            let (up, down) = (s.map(BlockSlots::up), s.and_then(BlockSlots::down));
            let mlp = block.mlp.forward_folded(&x1, block.ln_2.eps(), up, down)?;
            let Some(next) = mlp else {
                candle_core::bail!("norm-fold: block {i}'s MLP projection did not apply");
            };
            x = next;
        }
        self.ln_f.forward_kernel(&x).map(Some)
    }

    /// Elements of the largest weight a norm folds into (c_attn's or c_fc's).
    fn widest_folded(&self) -> usize {
        let c = &self.cfg;
        c.n_embd * c.n_inner().max(3 * c.n_embd)
    }

    /// The weights of [`Gpt2::blocks_cached`]'s one kernel; None where it does not apply
    /// (scores scaled by the layer index, tensor parallelism, fp8 weights).
    fn step_model(&self) -> candle_core::Result<Option<kernels::StepModel>> {
        let cfg = &self.cfg;
        let same_scale = (0..cfg.n_layer).all(|i| cfg.attn_scale(i) == cfg.attn_scale(0));
        let (Some(lnf), true) = (
            self.ln_f.parts(),
            same_scale && self.local_heads == cfg.n_head,
        ) else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(self.h.len());
        for b in &self.h {
            match step_layer(&b.ln_1, &b.attn.c_attn, &b.attn.c_proj, &b.ln_2, &b.mlp)? {
                Some(l) => layers.push(l),
                None => return Ok(None),
            }
        }
        let hs = cfg.n_embd / cfg.n_head;
        let attention = kernels::StepAttention {
            nh: cfg.n_head,
            hs,
            layout: QkvLayout {
                head_stride: hs,
                part: cfg.n_embd,
            },
            scale: cfg.attn_scale(0),
            slopes: None,
        };
        kernels::StepModel::new(layers, lnf, self.ln_f.eps(), attention)
    }

    /// The blocks and ln_f of an inference forward from its token and position embeddings
    /// (B, T, C) each, `attend` giving layer i's attention branch of its normed input. Each
    /// add goes with the norm after it ([`Norm::add_forward`]: one kernel on CUDA, the
    /// embeddings' sum too).
    fn blocks_inference(
        &self,
        (tok, pos): (Tensor, Tensor),
        attend: impl Fn(usize, &Attention, &Tensor) -> candle_core::Result<Unsummed>,
    ) -> candle_core::Result<Tensor> {
        let first = self.h.first().map_or(&self.ln_f, |b| &b.ln_1);
        let (mut x, mut h) = first.add_forward(&tok, &pos)?;
        for (i, block) in self.h.iter().enumerate() {
            // Each branch's sum over the ranks goes with the add and the norm after it.
            let a = attend(i, &block.attn, &h)?;
            let (x1, h2) = block.ln_2.add_unsummed(&x, a)?;
            let m = block.mlp.forward_unsummed(&h2)?;
            let next = self.h.get(i + 1).map_or(&self.ln_f, |b| &b.ln_1);
            (x, h) = next.add_unsummed(&x1, m)?;
        }
        Ok(h)
    }

    /// The blocks and ln_f over sequences packed end to end, ids and positions (1, N) ->
    /// (1, N, C); with `kv` (a packed prefill) each layer's keys and values go into the cache.
    fn blocks_packed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        whole: &WholeSequences,
        kv: Option<(&KvCache, &Step)>,
    ) -> candle_core::Result<Tensor> {
        let embeddings = self.embed_at(ids, positions)?; // (1, N, C) twice
        self.blocks_inference(embeddings, |i, attn, h| {
            let kv = kv
                .map(|(cache, step)| cache.layer_step(i, step))
                .transpose()?;
            attn.whole_unsummed(h, whole, kv)
        })
    }

    /// The logits of each row's last hidden state, (B, C) -> (B, V); under tensor parallelism
    /// the head split over the ranks.
    fn last_logits(&self, last: &Tensor) -> candle_core::Result<Tensor> {
        let head = self.lm_head.as_ref().unwrap_or(&self.wte);
        if let Some(logits) = split_head_logits(last, head, &self.tp)? {
            return Ok(logits); // (B, V)
        }
        self.logits(last) // (B, V)
    }

    /// Token and position embeddings of the new positions, (B, T, C) each; positions: (B, T)
    /// f32 or u32.
    fn embed_at(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let (b, t) = input_ids.dims2()?;
        let pos = positions.to_dtype(DType::U32)?.flatten_all()?; // (B·T,)
        let pos = self.wpe.index_select(&pos, 0)?; // (B·T, C)
        let tok = self.wte.index_select(&input_ids.flatten_all()?, 0)?; // (B·T, C)
        Ok((tok.reshape((b, t, ()))?, pos.reshape((b, t, ()))?))
    }
}

/// Position ids of sequences packed end to end, each from 0: (1, Σ lens) u32.
fn packed_positions(lens: &[usize], device: &Device) -> candle_core::Result<Tensor> {
    let positions: Vec<u32> = lens.iter().flat_map(|&n| 0..n as u32).collect();
    let n = positions.len();
    Tensor::from_vec(positions, (1, n), device)
}

impl CausalLm for Gpt2 {
    fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if t > self.cfg.n_positions {
            candle_core::bail!(
                "sequence of {t} tokens is longer than n_positions {}",
                self.cfg.n_positions
            );
        }
        if !self.mode.train {
            // Positions 0..T for every row: exact for right-padded batches, which the suites use.
            let positions = positions(t, input_ids.device())?
                .unsqueeze(0)?
                .repeat((b, 1))?;
            let embeddings = self.embed_at(input_ids, &positions)?; // (B, T, C) twice
            let whole = WholeSequences::new(attention_mask)?;
            return self.blocks_inference(embeddings, |_, attn, h| {
                attn.whole_unsummed(h, &whole, None)
            });
        }
        let pos = self
            .wpe
            .index_select(&positions(t, input_ids.device())?, 0)?; // (T, C)
        let tok = self.wte.index_select(&input_ids.flatten_all()?, 0)?; // (B·T, C)
        let x = tok.reshape((b, t, ()))?.broadcast_add(&pos)?; // (B, T, C)
        let mut x = dropout(&x, self.mode.dropout.embd)?;
        let bias = causal_padding_bias(attention_mask)?; // (B, 1, T, T)
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
        let hs = self.cfg.n_embd / self.cfg.n_head;
        let (dtype, device) = (self.wte.dtype(), input_ids.device());
        if self.mode.train || !kernels::prefill_applies(dtype, device, hs) {
            return Ok(None);
        }
        if let Some(n) = lens.iter().find(|&&n| n > self.cfg.n_positions) {
            candle_core::bail!(
                "sequence of {n} tokens is longer than n_positions {}",
                self.cfg.n_positions
            );
        }
        let positions = packed_positions(lens, device)?; // (1, N)
        let whole = WholeSequences::packed(lens, device)?;
        Ok(Some(
            self.blocks_packed(input_ids, &positions, &whole, None)?,
        ))
    }

    fn prefill_packed(
        &self,
        input_ids: &Tensor,
        lens: &[usize],
        cache: &mut KvCache,
    ) -> candle_core::Result<Option<Tensor>> {
        let hs = self.cfg.n_embd / self.cfg.n_head;
        let (dtype, device) = (self.wte.dtype(), input_ids.device());
        let t = input_ids.dim(1)?;
        if !kernels::prefill_applies(dtype, device, hs) || t > self.cfg.n_positions {
            return Ok(None); // forward_cached says what is too long
        }
        let Some(packed) = cache.packed_prompts(lens, t)? else {
            return Ok(None);
        };
        let step = cache.begin(&packed.mask, self.h.len())?;
        let ids = input_ids.flatten_all()?.index_select(&packed.gather, 0)?; // (N,)
        let ids = ids.unsqueeze(0)?; // (1, N)
        let positions = packed_positions(lens, device)?; // (1, N): the cache's, left-padded
        let whole = WholeSequences::packed(lens, device)?;
        let kv = Some((&*cache, &step));
        let h = self.blocks_packed(&ids, &positions, &whole, kv)?; // (1, N, C)
        cache.commit(step);
        let last = h.squeeze(0)?.index_select(&packed.last, 0)?; // (B, C)
        self.last_logits(&last).map(Some)
    }

    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(head) = &self.head_fp8 {
            return fp8_lm_head(hidden, head); // (N, V)
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.wte); // (V, C)
        lm_head(hidden, head) // (N, V)
    }

    fn logits_padded(
        &self,
        hidden: &Tensor,
        multiple: usize,
    ) -> candle_core::Result<(Tensor, usize)> {
        let head = self.lm_head.as_ref().unwrap_or(&self.wte); // (V, C)
        let (v, c) = head.dims2()?;
        if self.head_fp8.is_some() {
            return Ok((self.logits(hidden)?, v)); // the fp8 head unpadded
        }
        let pad = v.next_multiple_of(multiple.max(1)) - v;
        if pad == 0 {
            return Ok((self.logits(hidden)?, v));
        }
        let zeros = Tensor::zeros((pad, c), head.dtype(), head.device())?;
        let head = Tensor::cat(&[head, &zeros], 0)?; // (V', C)
        Ok((hidden.matmul(&head.t()?)?, v)) // (N, V')
    }

    fn new_cache(&self, batch: usize, max_len: usize) -> candle_core::Result<KvCache> {
        let hs = self.cfg.n_embd / self.cfg.n_head;
        let shape = (self.local_heads, hs);
        let (dtype, device) = (self.wte.dtype(), self.wte.device());
        let row_bytes = self.cfg.n_embd * dtype.size_in_bytes();
        let slots = norm_fold::slots_for(self.norms_folded, batch, self.h.len(), row_bytes);
        KvCache::new(self.h.len(), batch, max_len, shape, dtype, device)?.with_norm_stats(slots)
    }

    /// Position ids from the mask, as HF `generate` makes them for left-padded batches:
    /// cumsum(mask) − 1, 0 for padding.
    fn forward_cached(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        cache: &mut KvCache,
    ) -> candle_core::Result<Tensor> {
        let t = input_ids.dim(1)?;
        if cache.position_bound() + t > self.cfg.n_positions {
            return Err(candle_core::Error::Msg(format!(
                "{} cached + {t} new positions is more than n_positions {}: use shorter prompts or fewer new tokens",
                cache.position_bound(),
                self.cfg.n_positions
            )));
        }
        let step = cache.begin(attention_mask, self.h.len())?;
        let h = match self.folded_from_ids(input_ids, cache, &step)? {
            Some(h) => h,
            None => {
                let embeddings = self.embed_at(input_ids, &step.positions)?; // (B, T, C) twice
                self.blocks_cached(embeddings, cache, &step)? // (B, T, C), after ln_f
            }
        };
        cache.commit(step);
        let last = h.narrow(1, t - 1, 1)?.squeeze(1)?.contiguous()?; // (B, C)
        self.last_logits(&last)
    }

    fn max_positions(&self) -> usize {
        self.cfg.n_positions
    }

    fn graph_capturable(&self) -> bool {
        let projections = self.h.iter().flat_map(|b| [&b.attn.c_proj, &b.mlp.down]);
        projections.into_iter().all(Projection::graph_capturable)
    }

    fn quantize_fp8(&mut self) -> candle_core::Result<()> {
        for p in self.h.iter_mut().flat_map(Block::projections) {
            p.to_fp8()?;
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.wte); // (V, C)
        self.head_fp8 = Some(Fp8Weight::quantize(head, None)?);
        Ok(())
    }

    /// Not under tensor parallelism: its row-parallel projections keep the layout their
    /// shards were cut in.
    fn prepare_decode(&mut self) -> candle_core::Result<()> {
        if self.local_heads != self.cfg.n_head {
            return Ok(());
        }
        for p in self.h.iter_mut().flat_map(Block::projections) {
            p.to_linear()?;
        }
        Ok(())
    }

    /// Folds each block's two LayerNorms into the projections after them ([`super::norm_fold`]),
    /// laid out as nn.Linear's, where it applies and the MLP's activation is tanh GELU.
    fn fold_norms(&mut self, rows: usize) -> candle_core::Result<()> {
        let (dtype, device) = (self.wte.dtype(), self.wte.device());
        let hidden = self.wte.dim(1)?;
        let tanh = self.h.iter().all(|b| b.mlp.act == Activation::GeluTanh);
        let takes = norm_fold::folds(rows, self.widest_folded())
            && norm_fold::applies(dtype, hidden, device, &self.tp);
        if self.norms_folded || !tanh || !takes {
            return Ok(());
        }
        let mut all = true;
        for b in &mut self.h {
            all &= b.ln_1.fold_into(&mut b.attn.c_attn)?;
            all &= b.ln_2.fold_into(&mut b.mlp.up)?;
        }
        self.norms_folded = all;
        Ok(())
    }

    fn set_training(&mut self, with_dropout: bool) {
        let c = &self.cfg;
        self.mode = Mode {
            train: true,
            dropout: match with_dropout {
                true => Dropout {
                    embd: c.embd_pdrop,
                    attn: c.attn_pdrop,
                    resid: c.resid_pdrop,
                },
                false => Dropout::default(),
            },
        };
    }
}
