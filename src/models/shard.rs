//! Megatron-style tensor parallelism (Shoeybi et al., 2019, "Megatron-LM"): which slice of each
//! weight a rank holds.
//!
//! A transformer block needs one all-reduce per residual branch: the first projection of a
//! branch (qkv, MLP up) is *column-parallel*, each rank computing a slice of the heads / hidden
//! units; the second (attention out, MLP down) is *row-parallel*, each rank multiplying its
//! slice of the input and the partial outputs summed across ranks, then the bias added once.
//! Embeddings, norms and the LM head are replicated.
//!
//! Sharding happens in the weight backend, by checkpoint name: a model asks for the full
//! (checkpoint) shape as always, and [`Sharded`] hands back this rank's slice. So a checkpoint
//! is read a slice at a time ([`NarrowSource`]), and random weights are generated whole from
//! the same seed and then sliced: tp=N computes the same model as tp=1.

use crate::dist::part;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::Init;
use std::ops::Range;
use std::sync::Arc;

/// How one weight is split: along `dim`, which holds `blocks` equal blocks (GPT-2's fused
/// [q | k | v] is 3 blocks) of units of `unit` elements (a head's `hs` columns, one hidden
/// unit); a rank takes its [`part`] of the units of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub dim: usize,
    pub blocks: usize,
    pub unit: usize,
}

impl Split {
    /// The index ranges along `dim` (of length `len`) that `rank` of `size` holds.
    pub fn ranges(&self, len: usize, rank: usize, size: usize) -> Vec<Range<usize>> {
        let block = len / self.blocks;
        let units = part(block / self.unit, rank, size);
        (0..self.blocks)
            .map(|b| b * block + units.start * self.unit..b * block + units.end * self.unit)
            .collect()
    }
}

/// Each architecture's naming of what is split: checkpoint name (without prefix) → split, None
/// for replicated tensors.
pub type SplitRule = Arc<dyn Fn(&str) -> Option<Split> + Send + Sync>;

/// Index ranges along one dimension of a tensor.
pub struct Slices<'a> {
    pub dim: usize,
    pub ranges: &'a [Range<usize>],
}

/// A weight source that can hand out slices of a tensor along one dimension.
pub trait NarrowSource: SimpleBackend {
    /// `name` (full shape `full`) restricted to `slices`, concatenated along their dimension.
    /// The default makes the whole tensor and slices it (random weights).
    fn get_slices(
        &self,
        full: Shape,
        name: &str,
        init: Init,
        dtype: DType,
        dev: &Device,
        slices: Slices,
    ) -> candle_core::Result<Tensor> {
        let t = self.get(full, name, init, dtype, dev)?;
        let dim = slices.dim;
        let pieces = slices
            .ranges
            .iter()
            .map(|r| t.narrow(dim, r.start, r.len()))
            .collect::<candle_core::Result<Vec<_>>>()?;
        match pieces.as_slice() {
            // A copy of just the slice: a narrowed view would keep the whole tensor alive.
            [one] => one.force_contiguous(),
            _ => Tensor::cat(&pieces, dim),
        }
    }
}

/// The slices of `inner`'s tensors that rank `rank` of `size` holds, by `rule`.
pub struct Sharded<B> {
    pub inner: B,
    pub rank: usize,
    pub size: usize,
    pub rule: SplitRule,
}

impl<B: NarrowSource> SimpleBackend for Sharded<B> {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        match (self.rule)(name) {
            Some(split) if self.size > 1 => {
                let ranges = split.ranges(s.dims()[split.dim], self.rank, self.size);
                let slices = Slices {
                    dim: split.dim,
                    ranges: &ranges,
                };
                self.inner.get_slices(s, name, h, dtype, dev, slices)
            }
            _ => self.inner.get(s, name, h, dtype, dev),
        }
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.inner.get_unchecked(name, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
}
