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

use crate::kernels::CacheSlot;
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

impl Step {
    /// Whether the step finds its position on the device (a step a CUDA graph can replay):
    /// then only the decode kernel attends, and no bias over the first Tk keys is made.
    pub fn on_device(&self) -> bool {
        self.cursor.is_some()
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
        })
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache holds (T_max).
    pub fn max_len(&self) -> usize {
        self.max_len
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
        self.len = 0;
        self.cursor = None;
        Ok(())
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

    /// Takes the positions of `step` as written (every layer has appended its keys and values).
    pub fn commit(&mut self, step: Step) {
        self.len = step.start + step.t;
        self.seen = step.seen_after;
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
