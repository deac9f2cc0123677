//! The KV cache of incremental decoding, as candle-transformers' `Cache`: preallocated for a
//! batch and a longest sequence, written in place (`slice_set`) as positions arrive, so a
//! decode step copies only its own keys and values and never concatenates.
//!
//! One cache belongs to one model instance; under tensor parallelism each rank caches its own
//! heads. Besides keys and values it carries what decoding needs to know of the earlier
//! positions: the attention mask (left padding) and each key's position, from which GPT-2's
//! position ids and BLOOM's ALiBi bias come, as in HF `generate`.
//!
//! Shapes: `B` batch, `nh` heads (of this rank), `T_max` positions the cache holds, `T` new
//! positions of a forward, `Tk` = `len` + `T` keys, `hs` head size.

use crate::kernels::{CacheSlot, QkvLayout, SeqRows};
use candle_core::{DType, Device, Result, Tensor};

/// Keys and values of one layer, each (B, nh, T_max, hs) in the model dtype; positions
/// `0..len` of the owning [`KvCache`] are written.
pub struct LayerKv {
    k: Tensor,
    v: Tensor,
}

impl LayerKv {
    /// Writes the new keys and values k, v: (B, nh, T, hs) at positions `start..start + T`
    /// (in place) and returns every cached position so far, (B, nh, start + T, hs) each: views
    /// of the cache (row stride T_max·hs), which batched matmuls read without a copy.
    pub fn append(&self, k: &Tensor, v: &Tensor, start: usize) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        self.k.slice_set(&k.contiguous()?, 2, start)?;
        self.v.slice_set(&v.contiguous()?, 2, start)?;
        Ok((
            self.k.narrow(2, 0, start + t)?,
            self.v.narrow(2, 0, start + t)?,
        ))
    }
}

/// One layer's keys and values in a forward of new positions ([`KvCache::layer_step`]).
#[derive(Clone, Copy)]
pub struct LayerStep<'a> {
    kv: &'a LayerKv,
    step: &'a Step,
}

impl<'a> LayerStep<'a> {
    /// [`LayerKv::append`] at this forward's start.
    pub fn append(&self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.kv.append(k, v, self.step.start)
    }

    /// One new position per row: what the decode kernel serves.
    pub fn is_decode(&self) -> bool {
        self.step.t == 1
    }

    /// An error unless the decode kernel served this step: with a device-side cursor (a step
    /// a CUDA graph replays) the composed attention would attend the capture's positions only.
    pub fn check_kernel_served(&self) -> Result<()> {
        if self.step.cursor.is_some() {
            candle_core::bail!(
                "the decode attention kernel does not apply to this KV cache (it takes head sizes up to 512 and about 11k positions): leave graph out of --fused"
            );
        }
        Ok(())
    }

    /// A packed prefill's keys and values (qkv (1, N, 3C) laid out as `layout`, `rows` the
    /// prompts end to end) into this layer's cache where left padding puts them: each prompt
    /// ends at this forward's last column, its padding columns zeroed. An error where the
    /// kernel does not apply (callers of [`KvCache::packed_prompts`] check
    /// [`crate::kernels::prefill_applies`] first).
    pub fn write_packed(
        &self,
        qkv: &Tensor,
        layout: QkvLayout,
        heads: (usize, usize),
        rows: SeqRows,
    ) -> Result<()> {
        let end = self.step.start + self.step.t;
        let caches = (&self.kv.k, &self.kv.v);
        if !crate::kernels::prefill_kv(qkv, layout, heads, rows, caches, end)? {
            return Err(candle_core::Error::Msg(
                "the packed prefill's KV cache kernel does not apply to these tensors (it takes bf16 / f16 on CUDA in 16-byte rows): leave prefill out of --fused".into(),
            ));
        }
        Ok(())
    }

    /// The cache as the decode kernel reads and writes it: the new key and value go at
    /// `start`, the mask and positions are the whole (B, T_max) tensors.
    pub fn slot(&self) -> CacheSlot<'a> {
        CacheSlot {
            k: &self.kv.k,
            v: &self.kv.v,
            key_mask: &self.step.mask_all,
            key_pos: &self.step.key_pos_all,
            pos: self.step.start,
            cursor: self.step.cursor.as_ref(),
        }
    }
}

/// Preallocated keys and values of every layer, plus the mask and positions of the cached
/// tokens. Layout:
/// - `layers[l]`: k and v of layer l, (B, nh, T_max, hs) each, model dtype;
/// - `mask`: (B, T_max) f32, 1 for a real token, 0 for padding;
/// - `key_pos`: (B, T_max) f32, each token's position (cumsum(mask) − 1)·mask: GPT-2's
///   position id and the `arange_tensor` of HF's `build_alibi_tensor`, 0 for padding;
/// - `seen`: (B, 1) f32, real tokens so far per row (the next real token's position).
///
/// Positions `0..len` hold data; a forward of T new positions writes `len..len + T`.
pub struct KvCache {
    layers: Vec<LayerKv>,
    mask: Tensor,
    key_pos: Tensor,
    seen: Tensor,
    len: usize,
    max_len: usize,
    /// (1,) u32 on the device: positions written, when a decode step finds its position
    /// there ([`KvCache::start_device_cursor`]); `len` then lags until synced.
    cursor: Option<Tensor>,
    /// Slots ([`super::slots`]): the most real tokens of any row, which their positions stay
    /// under while the columns run further; None: a batch that started together, whose
    /// positions stay under `len`.
    seen_bound: Option<usize>,
    /// (norms, NORM_SLOTS, NORM_LINE) f64, one row: a decode step's folded norms' statistics,
    /// summed by the GEMV before each norm and zeroed by the folded GEMVs after (`--fused
    /// norm-stats`, [`super::norm_fold::BlockSlots`]); zero again for each generation.
    norm_stats: Option<Tensor>,
}

/// What a forward of new positions needs from the cache before its layers run; the cache
/// takes them as written once the forward ends ([`KvCache::commit`]).
pub struct Step {
    /// Cached positions before this forward; the new ones start here (with a device-side
    /// cursor: the host's count, which a graph replay does not advance).
    pub start: usize,
    /// New positions T.
    pub t: usize,
    /// Positions of the new tokens, (B, T) f32: (seen + cumsum(mask) − 1)·mask.
    pub positions: Tensor,
    /// Key mask of every position so far, (B, Tk) f32.
    pub key_mask: Tensor,
    /// Key positions of every position so far, (B, Tk) f32.
    pub key_pos: Tensor,
    seen_after: Tensor, // (B, 1) f32
    /// The cache's whole mask and positions, (B, T_max) f32 each, this forward's written.
    mask_all: Tensor,
    key_pos_all: Tensor,
    /// The cache's device-side cursor, when the step reads its position there.
    cursor: Option<Tensor>,
}

/// Left-padded prompts (B, T) prefilled packed into an empty cache: their real tokens end to
/// end, no padding rows ([`KvCache::packed_prompts`]). N = Σ lens.
pub struct PackedPrompts {
    /// (N,) u32: each real token's index in the prompts' flattened (B·T) ids.
    pub gather: Tensor,
    /// (B, T) u32: the left-padded attention mask of these lengths (1 real, 0 padding), which
    /// [`KvCache::begin`] takes; the lengths, not the caller's pad ids, place the tokens.
    pub mask: Tensor,
    /// (B,) u32: each prompt's last token among the N rows (whose logits generation reads).
    pub last: Tensor,
}

impl Step {
    /// Whether the step finds its position on the device (a step a CUDA graph can replay):
    /// then only the decode kernel attends, and no bias over the first Tk keys is made.
    pub fn on_device(&self) -> bool {
        self.cursor.is_some()
    }

    /// The causal and padding bias of the new positions, (B, 1, T, Tk); none for a step on the
    /// device (its shape would be the capture's).
    pub fn causal_padding_bias(&self) -> Result<Option<Tensor>> {
        match self.on_device() {
            true => Ok(None),
            false => super::attention::causal_padding_bias_last(&self.key_mask, self.t).map(Some),
        }
    }
}

impl KvCache {
    /// A cache of `n_layer` layers for `batch` rows of up to `max_len` positions, `n_head`
    /// heads of `head_size` in `dtype` on `device`.
    pub fn new(
        n_layer: usize,
        batch: usize,
        max_len: usize,
        (n_head, head_size): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        if batch == 0 || max_len == 0 {
            return Err(candle_core::Error::Msg(format!(
                "a KV cache needs at least one row and one position (asked for batch {batch}, {max_len} positions)"
            )));
        }
        let shape = (batch, n_head, max_len, head_size); // (B, nh, T_max, hs)
        let layers = (0..n_layer)
            .map(|_| {
                Ok(LayerKv {
                    k: Tensor::zeros(shape, dtype, device)?,
                    v: Tensor::zeros(shape, dtype, device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            mask: Tensor::zeros((batch, max_len), DType::F32, device)?,
            key_pos: Tensor::zeros((batch, max_len), DType::F32, device)?,
            seen: Tensor::zeros((batch, 1), DType::F32, device)?,
            len: 0,
            max_len,
            cursor: None,
            seen_bound: None,
            norm_stats: None,
        })
    }

    /// This cache with zeroed slots for `norms` folded norms' statistics, where given
    /// ([`KvCache::norm_stats`]).
    pub fn with_norm_stats(mut self, norms: Option<usize>) -> Result<Self> {
        let Some(norms) = norms else {
            return Ok(self);
        };
        use crate::kernels::{NORM_LINE, NORM_SLOTS};
        if self.batch() != 1 {
            candle_core::bail!(
                "norm-stats' slots are for one row, the cache has {}",
                self.batch()
            );
        }
        let shape = (norms, NORM_SLOTS, NORM_LINE);
        self.norm_stats = Some(Tensor::zeros(shape, DType::F64, self.device())?);
        Ok(self)
    }

    /// The slots of a decode step's folded norms' statistics, (norms, NORM_SLOTS, NORM_LINE) f64,
    /// where the model asked for them.
    pub fn norm_stats(&self) -> Option<&Tensor> {
        self.norm_stats.as_ref()
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An upper bound of the position ids so far: the next real token of any row is at most
    /// this (GPT-2 checks it against its learned positions).
    pub fn position_bound(&self) -> usize {
        self.seen_bound.unwrap_or(self.len)
    }

    /// Positions the cache holds (T_max).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Where the cache lives.
    pub fn device(&self) -> &Device {
        self.mask.device()
    }

    /// Rows (B).
    pub fn batch(&self) -> usize {
        self.seen.dims()[0]
    }

    /// Bytes of the keys and values (the mask and positions, 8·B·T_max bytes, left out).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.elem_count() + l.v.elem_count()) * l.k.dtype().size_in_bytes())
            .sum()
    }

    /// Empties the cache for a new batch of the same size, keeping its memory.
    pub fn reset(&mut self) -> Result<()> {
        self.seen = self.seen.zeros_like()?;
        // A step that failed part-way may have left sums in them. New memory: a CUDA graph
        // holds the old address, but lives only in the generation that captured it.
        if let Some(s) = &self.norm_stats {
            self.norm_stats = Some(s.zeros_like()?);
        }
        self.len = 0;
        self.cursor = None;
        self.seen_bound = None;
        Ok(())
    }

    /// The device-side cursor ((1,) u32: positions written), once started.
    pub fn device_cursor(&self) -> Option<&Tensor> {
        self.cursor.as_ref()
    }

    /// From now on each decode step (one new position) finds its position on the device and
    /// advances it there, with `seen`, in place (one kernel: [`kernels::decode_begin`]), so that
    /// a CUDA graph of the step replays at every position. False where that kernel does not
    /// apply (the CPU, `--fused` without decode); [`KvCache::sync_from_device`] catches `len` up.
    ///
    /// [`kernels::decode_begin`]: crate::kernels::decode_begin
    pub fn start_device_cursor(&mut self) -> Result<bool> {
        let dev = self.mask.device().clone();
        if !dev.is_cuda() || !crate::kernels::enabled(crate::kernels::Fused::Decode) {
            return Ok(false);
        }
        self.seen = self.seen.contiguous()?.copy()?; // (B, 1) f32, written in place from now
        self.cursor = Some(Tensor::new(&[self.len as u32], &dev)?);
        Ok(true)
    }

    /// `len` from the device-side cursor (after graph replays, which the host does not count).
    pub fn sync_from_device(&mut self) -> Result<()> {
        if let Some(c) = &self.cursor {
            self.len = c.to_vec1::<u32>()?[0] as usize;
        }
        Ok(())
    }

    /// The packed rows of a prefill of left-padded prompts of `t` positions, row b's last
    /// `lens[b]` real (padding first); None unless the cache is empty (the packed attention
    /// attends the prompts' own tokens only).
    pub fn packed_prompts(&self, lens: &[usize], t: usize) -> Result<Option<PackedPrompts>> {
        if self.len != 0 || self.cursor.is_some() {
            return Ok(None);
        }
        if lens.len() != self.batch() || lens.iter().any(|&n| n == 0 || n > t) {
            return Err(candle_core::Error::Msg(format!(
                "a packed prefill of {} prompts of lengths {lens:?} (padded to {t}) into a KV cache of {} rows: every prompt needs 1 to {t} tokens, one a row",
                lens.len(),
                self.batch()
            )));
        }
        let dev = self.device();
        let gather: Vec<u32> = (lens.iter().enumerate())
            .flat_map(|(b, &n)| (b * t + t - n..(b + 1) * t).map(|i| i as u32))
            .collect();
        let n = gather.len();
        let mask: Vec<u32> = (lens.iter())
            .flat_map(|&n| (0..t).map(move |c| u32::from(c >= t - n)))
            .collect();
        let last: Vec<u32> = (lens.iter())
            .scan(0, |end, &n| {
                *end += n;
                Some(*end as u32 - 1)
            })
            .collect();
        Ok(Some(PackedPrompts {
            gather: Tensor::from_vec(gather, n, dev)?,
            mask: Tensor::from_vec(mask, (lens.len(), t), dev)?,
            last: Tensor::from_vec(last, lens.len(), dev)?,
        }))
    }

    /// Layer `i`'s keys and values.
    pub fn layer(&self, i: usize) -> Result<&LayerKv> {
        self.layers.get(i).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "the KV cache has {} layers, the model asked for layer {i}: make the cache with this model's new_cache",
                self.layers.len()
            ))
        })
    }

    /// Layer `i` in the forward `step` ([`KvCache::begin`]).
    pub fn layer_step<'a>(&'a self, i: usize, step: &'a Step) -> Result<LayerStep<'a>> {
        Ok(LayerStep {
            kv: self.layer(i)?,
            step,
        })
    }

    /// Starts a forward of the new positions whose `attention_mask` is (B, T) (1 real token,
    /// 0 padding): checks that they fit, writes their mask and positions at `len..len + T`,
    /// and returns what the layers need.
    pub fn begin(&self, attention_mask: &Tensor, n_layer: usize) -> Result<Step> {
        let (b, t) = attention_mask.dims2()?;
        if b != self.batch() || n_layer != self.layers.len() {
            return Err(candle_core::Error::Msg(format!(
                "the KV cache is for {} rows of a {}-layer model, the forward has {b} rows of a {n_layer}-layer model: make the cache with this model's new_cache",
                self.batch(),
                self.layers.len()
            )));
        }
        let (start, tk) = (self.len, self.len + t);
        if t == 0 || tk > self.max_len {
            return Err(candle_core::Error::Msg(format!(
                "{t} new positions after {start} cached do not fit the KV cache of {} positions: make the cache with room for prompt + new tokens",
                self.max_len
            )));
        }
        if let (Some(cursor), 1) = (&self.cursor, t) {
            return self.begin_on_device(cursor, tk);
        }
        let mask = attention_mask.to_dtype(DType::F32)?.contiguous()?; // (B, T)
        let cum = if t == 1 {
            mask.clone()
        } else {
            mask.cumsum(1)?
        };
        let positions = ((cum.broadcast_add(&self.seen)? - 1.)? * &mask)?; // (B, T)
        let seen_after = self.seen.broadcast_add(&cum.narrow(1, t - 1, 1)?)?; // (B, 1)
        self.mask.slice_set(&mask, 1, start)?;
        self.key_pos.slice_set(&positions, 1, start)?;
        Ok(Step {
            start,
            t,
            positions,
            key_mask: self.mask.narrow(1, 0, tk)?,
            key_pos: self.key_pos.narrow(1, 0, tk)?,
            seen_after,
            mask_all: self.mask.clone(),
            key_pos_all: self.key_pos.clone(),
            cursor: None,
        })
    }

    /// [`KvCache::begin`] of one real new token a row at the device-side cursor: every tensor
    /// it launches on has the same shape at every position (the narrow views, `len` on the
    /// host, serve only the composed attention outside a graph).
    fn begin_on_device(&self, cursor: &Tensor, tk: usize) -> Result<Step> {
        let positions =
            crate::kernels::decode_begin(&self.mask, &self.key_pos, &self.seen, cursor)?
                .ok_or_else(|| {
                    candle_core::Error::Msg(
                        "the decode-step kernel did not apply to this KV cache".into(),
                    )
                })?; // (B, 1) f32
        Ok(Step {
            start: self.len,
            t: 1,
            positions,
            key_mask: self.mask.narrow(1, 0, tk)?,
            key_pos: self.key_pos.narrow(1, 0, tk)?,
            seen_after: self.seen.clone(), // advanced in place
            mask_all: self.mask.clone(),
            key_pos_all: self.key_pos.clone(),
            cursor: Some(cursor.clone()),
        })
    }

    /// Slots ([`super::slots`]): the most real tokens any row has, so that
    /// [`KvCache::position_bound`] follows the rows rather than the columns.
    pub fn bound_positions(&mut self, seen_max: usize) {
        self.seen_bound = Some(seen_max);
    }

    /// Slots: columns `len..new_len` become padding in every row (mask and position 0), so
    /// that a prompt of `new_len` tokens fits before the next column.
    pub fn pad_to(&mut self, new_len: usize) -> Result<()> {
        self.check_slot_op(new_len)?;
        if new_len > self.len {
            let (b, n) = (self.batch(), new_len - self.len);
            let zeros = Tensor::zeros((b, n), DType::F32, self.mask.device())?; // (B, n)
            self.mask.slice_set(&zeros, 1, self.len)?;
            self.key_pos.slice_set(&zeros, 1, self.len)?;
            self.len = new_len;
        }
        Ok(())
    }

    /// Slots: copies `src`'s row 0 (its `src.len()` positions: a prompt prefilled alone) into
    /// row `row` at columns `at..at + n` of every layer, with its mask, positions and real
    /// tokens; the row's other columns become padding. The columns must be written already
    /// (`at + n <= len`).
    pub fn place_row(&mut self, row: usize, src: &KvCache, at: usize) -> Result<()> {
        let n = src.len;
        self.check_slot_op(at + n)?;
        if row >= self.batch() || at + n > self.len || src.layers.len() != self.layers.len() {
            candle_core::bail!(
                "row {row} at columns {at}..{} does not fit a KV cache of {} rows and {} written columns",
                at + n,
                self.batch(),
                self.len
            );
        }
        for (dst, from) in self.layers.iter().zip(&src.layers) {
            for (d, s) in [(&dst.k, &from.k), (&dst.v, &from.v)] {
                let part = s.narrow(0, 0, 1)?.narrow(2, 0, n)?.force_contiguous()?; // (1, nh, n, hs)
                d.narrow(0, row, 1)?.slice_set(&part, 2, at)?;
            }
        }
        let dev = self.mask.device().clone();
        let whole_row = |t: &Tensor| -> Result<Tensor> {
            let zeros = |w: usize| Tensor::zeros((1, w), DType::F32, &dev);
            let after = self.max_len - at - n;
            let parts = [(at, zeros(at)?), (n, t.narrow(0, 0, 1)?.narrow(1, 0, n)?)];
            let parts = parts.into_iter().chain([(after, zeros(after)?)]);
            let parts: Vec<Tensor> = parts.filter(|p| p.0 > 0).map(|p| p.1).collect();
            Tensor::cat(&parts, 1) // (1, T_max)
        };
        self.mask
            .narrow(0, row, 1)?
            .slice_set(&whole_row(&src.mask)?, 1, 0)?;
        self.key_pos
            .narrow(0, row, 1)?
            .slice_set(&whole_row(&src.key_pos)?, 1, 0)?;
        let seen = src.seen.narrow(0, 0, 1)?.force_contiguous()?; // (1, 1)
        self.seen.narrow(0, row, 1)?.slice_set(&seen, 0, 0)
    }

    /// Slots: drops columns `0..n` (padding of every row still in the cache), moving the
    /// others to the front; positions and masks move with their keys, so nothing a row
    /// attends changes.
    pub fn drop_front(&mut self, n: usize) -> Result<()> {
        self.check_slot_op(self.len)?;
        let (n, live) = (n.min(self.len), self.len - n.min(self.len));
        if n == 0 {
            return Ok(());
        }
        if live > 0 {
            for l in &self.layers {
                for t in [&l.k, &l.v] {
                    let kept = t.narrow(2, n, live)?.force_contiguous()?; // (B, nh, live, hs)
                    t.slice_set(&kept, 2, 0)?;
                }
            }
            for t in [&self.mask, &self.key_pos] {
                let kept = t.narrow(1, n, live)?.force_contiguous()?; // (B, live)
                t.slice_set(&kept, 1, 0)?;
            }
        }
        self.len = live;
        Ok(())
    }

    /// The slot operations' shared checks: no device-side cursor (a graph replaying the
    /// step would not see the columns move), `len` within the cache.
    fn check_slot_op(&self, len: usize) -> Result<()> {
        if self.cursor.is_some() {
            candle_core::bail!(
                "a KV cache whose decode steps replay as a CUDA graph cannot take slot operations"
            );
        }
        if len > self.max_len {
            candle_core::bail!(
                "{len} columns do not fit the KV cache of {} positions: make it with room for twice the longest request",
                self.max_len
            );
        }
        Ok(())
    }

    /// Takes the positions of `step` as written (every layer has appended its keys and values).
    pub fn commit(&mut self, step: Step) {
        self.len = step.start + step.t;
        self.seen = step.seen_after;
        self.seen_bound = self.seen_bound.map(|b| b + step.t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_the_mask_across_forwards() -> Result<()> {
        let dev = Device::Cpu;
        let mut cache = KvCache::new(1, 2, 6, (1, 2), DType::F32, &dev)?;
        // Row 0 has one padding position on the left, row 1 none.
        let step = cache.begin(&Tensor::new(&[[0u32, 1, 1], [1, 1, 1]], &dev)?, 1)?;
        assert_eq!(
            step.positions.to_vec2::<f32>()?,
            [[0., 0., 1.], [0., 1., 2.]]
        );
        cache.commit(step);
        let step = cache.begin(&Tensor::new(&[[1u32], [1]], &dev)?, 1)?;
        assert_eq!(step.positions.to_vec2::<f32>()?, [[2.], [3.]]);
        assert_eq!(
            step.key_pos.to_vec2::<f32>()?,
            [[0., 0., 1., 2.], [0., 1., 2., 3.]]
        );
        assert_eq!(
            step.key_mask.to_vec2::<f32>()?,
            [[0., 1., 1., 1.], [1., 1., 1., 1.]]
        );
        cache.commit(step);
        assert_eq!(cache.len(), 4);
        Ok(())
    }

    #[test]
    fn appended_keys_land_at_their_positions() -> Result<()> {
        let dev = Device::Cpu;
        let cache = KvCache::new(1, 1, 4, (2, 3), DType::F32, &dev)?;
        let k = Tensor::arange(0f32, 12., &dev)?.reshape((1, 2, 2, 3))?; // (B, nh, T, hs)
        cache.layer(0)?.append(&k, &k, 0)?;
        let k2 = (Tensor::ones((1, 2, 1, 3), DType::F32, &dev)? * 100.)?;
        let (all_k, all_v) = cache.layer(0)?.append(&k2, &k2, 2)?;
        assert_eq!(all_k.dims(), &[1, 2, 3, 3]);
        let want = Tensor::cat(&[&k, &k2], 2)?;
        let flat = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<f32>());
        assert_eq!(flat(&all_k)?, flat(&want)?);
        assert_eq!(flat(&all_v)?, flat(&want)?);
        Ok(())
    }

    /// Left-padded rows of 3, 1 and 4 real tokens at T = 4: their tokens end to end, the
    /// left-padded mask, the last of each; none once the cache holds positions; a one-line
    /// error for lengths that do not fit the rows.
    #[test]
    fn packed_prompts_gather_the_real_tokens_of_left_padded_rows() -> Result<()> {
        let dev = Device::Cpu;
        let mut cache = KvCache::new(1, 3, 8, (1, 2), DType::F32, &dev)?;
        let p = cache
            .packed_prompts(&[3, 1, 4], 4)?
            .expect("an empty cache");
        assert_eq!(p.gather.to_vec1::<u32>()?, [1, 2, 3, 7, 8, 9, 10, 11]);
        let mask = [[0u32, 1, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]];
        assert_eq!(p.mask.to_vec2::<u32>()?, mask);
        assert_eq!(p.last.to_vec1::<u32>()?, [2, 3, 7]);
        for bad in [&[3, 1][..], &[3, 0, 4], &[3, 5, 4]] {
            let err = cache.packed_prompts(bad, 4).err().map(|e| e.to_string());
            let err = err.unwrap_or_default();
            assert!(err.contains("every prompt needs 1 to 4 tokens"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        let step = cache.begin(&p.mask, 1)?;
        cache.commit(step);
        assert!(cache.packed_prompts(&[3, 1, 4], 4)?.is_none());
        Ok(())
    }

    #[test]
    fn a_full_cache_says_how_to_fix_it() -> Result<()> {
        let dev = Device::Cpu;
        let cache = KvCache::new(1, 1, 2, (1, 2), DType::F32, &dev)?;
        let err = cache
            .begin(&Tensor::new(&[[1u32, 1, 1]], &dev)?, 1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("room for prompt + new tokens"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        Ok(())
    }
}
