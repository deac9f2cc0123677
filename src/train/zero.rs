//! ZeRO stages 2 and 3 (`--zero 2|3`), FSDP's layout: the parameters are grouped into units
//! (each transformer block, and the rest: embeddings, final norm, head), each unit's fp32
//! values flattened and padded to a multiple of the ranks, and rank r keeps run r of every
//! unit: its master shard, its AdamW moments and its gradient shard. Gradients are
//! reduce-scattered a unit at a time as soon as the backward has made the whole unit (so the
//! summed gradient is never whole on any rank); the update runs on the shards.
//!
//! - Stage 2 keeps the whole fp32 masters on every rank (the step's compute copies are cast
//!   from them) and all-gathers the updated shards into them after each update.
//! - Stage 3 keeps only the shards: a step all-gathers each unit's compute-dtype weights when
//!   the forward or the backward reaches it and drops them after use (GPT-2's manual step).
//!
//! Shapes: `S` a unit's shard (values per rank), `R` ranks; a unit's flat vector is (R·S,),
//! its real values first, zeros after.

use super::optim::{sum_squares, Clip};
use crate::dist::AllReduce;
use candle_core::{DType, Result, Shape, Tensor, Var};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `--zero`: what the data-parallel ranks split between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZeroStage {
    /// Every rank holds everything (plain data parallelism).
    Off,
    /// The AdamW moments ([`super::DataParallel::owners`]).
    Optimizer,
    /// The moments, the fp32 masters' updates and the summed gradients.
    Gradients,
    /// All of that and the parameters themselves.
    Parameters,
}

impl ZeroStage {
    pub fn from_level(level: u8) -> Option<Self> {
        [
            Self::Off,
            Self::Optimizer,
            Self::Gradients,
            Self::Parameters,
        ]
        .get(level as usize)
        .copied()
    }

    pub fn level(self) -> u8 {
        self as u8
    }

    /// Stages 2 and 3 run on [`Sharded`] units.
    pub fn sharded(self) -> bool {
        self >= Self::Gradients
    }
}

/// The transformer block a parameter name belongs to (`h.3.attn…` or `transformer.h.3…`), or
/// None for the embeddings, final norm and head.
pub fn layer_of(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts
        .windows(2)
        .find(|w| w[0] == "h")
        .and_then(|w| w[1].parse().ok())
}

/// Parameters sharded together.
struct Unit {
    /// Indices into the trainer's parameter list, in load order.
    params: Vec<usize>,
    shapes: Vec<Shape>,
    /// Real values (the rest of the R·S are padding).
    numel: usize,
    /// S.
    shard: usize,
}

/// This rank's shards of every unit, and the collectives between them.
pub struct Sharded {
    rank: usize,
    size: usize,
    reduce: Arc<dyn AllReduce>,
    units: Vec<Unit>,
    /// Unit of each parameter index, and its place in the unit.
    place: Vec<(usize, usize)>,
    /// Block index → unit.
    blocks: BTreeMap<usize, usize>,
    /// This rank's fp32 master shard of each unit, (S,).
    pub masters: Vec<Var>,
}

impl Sharded {
    /// Units from `names` (unit 0: every parameter outside the blocks; then one a block, in
    /// block order) and this rank's shard of `params` (the whole fp32 masters, identical on
    /// every rank).
    pub fn new(
        names: &[String],
        params: &[Tensor],
        rank: usize,
        size: usize,
        reduce: Arc<dyn AllReduce>,
    ) -> Result<Self> {
        let mut by_layer: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            by_layer.entry(layer_of(name)).or_default().push(i);
        }
        let mut units = Vec::new();
        let mut blocks = BTreeMap::new();
        let mut place = vec![(0, 0); names.len()];
        for (layer, members) in by_layer {
            if let Some(l) = layer {
                blocks.insert(l, units.len());
            }
            let shapes: Vec<Shape> = members.iter().map(|&i| params[i].shape().clone()).collect();
            let numel = shapes.iter().map(Shape::elem_count).sum::<usize>();
            for (k, &i) in members.iter().enumerate() {
                place[i] = (units.len(), k);
            }
            units.push(Unit {
                params: members,
                shapes,
                numel,
                shard: numel.div_ceil(size),
            });
        }
        let mut z = Self {
            rank,
            size,
            reduce,
            units,
            place,
            blocks,
            masters: vec![],
        };
        z.masters = (0..z.units.len())
            .map(|u| {
                let unit: Vec<Tensor> = z.units[u]
                    .params
                    .iter()
                    .map(|&i| params[i].clone())
                    .collect();
                let (start, s) = (rank * z.units[u].shard, z.units[u].shard);
                Var::from_tensor(&z.flat(u, &unit)?.narrow(0, start, s)?.copy()?)
            })
            .collect::<Result<_>>()?;
        Ok(z)
    }

    /// Unit `u`'s tensors as one flat f32 vector padded with zeros, (R·S,).
    fn flat(&self, u: usize, tensors: &[Tensor]) -> Result<Tensor> {
        let unit = &self.units[u];
        let mut parts = tensors
            .iter()
            .map(|t| t.to_dtype(DType::F32)?.flatten_all())
            .collect::<Result<Vec<_>>>()?;
        let pad = unit.shard * self.size - unit.numel;
        if pad > 0 {
            parts.push(Tensor::zeros(pad, DType::F32, tensors[0].device())?);
        }
        Tensor::cat(&parts, 0)
    }

    pub fn n_units(&self) -> usize {
        self.units.len()
    }

    /// The units outside the blocks (embeddings, final norm, head).
    pub fn root_units(&self) -> Vec<usize> {
        let blocks: Vec<usize> = self.blocks.values().copied().collect();
        (0..self.units.len())
            .filter(|u| !blocks.contains(u))
            .collect()
    }

    /// The unit holding block `i`'s parameters.
    pub fn block_unit(&self, i: usize) -> Option<usize> {
        self.blocks.get(&i).copied()
    }

    /// Unit `u`'s whole tensors in `dtype` (an all-gather of the shards cast to it), in the
    /// unit's parameter order, with the parameter indices.
    pub fn gather(&self, u: usize, dtype: DType) -> Result<Vec<(usize, Tensor)>> {
        let unit = &self.units[u];
        let shard = self.masters[u].as_tensor().to_dtype(dtype)?;
        let whole = self.reduce.all_gather(&shard, self.rank, self.size)?; // (R·S,)
        let mut offset = 0;
        let tensors = unit.params.iter().zip(&unit.shapes).map(|(&i, shape)| {
            let n = shape.elem_count();
            offset += n;
            Ok((i, whole.narrow(0, offset - n, n)?.reshape(shape)?))
        });
        tensors.collect()
    }

    /// Every parameter, whole, in `dtype`, by parameter index.
    pub fn gather_all(&self, dtype: DType) -> Result<Vec<Tensor>> {
        let mut all: Vec<Option<Tensor>> = vec![None; self.place.len()];
        for u in 0..self.units.len() {
            for (i, t) in self.gather(u, dtype)? {
                all[i] = Some(t);
            }
        }
        Ok(all.into_iter().flatten().collect())
    }

    /// A step's gradient shards, fed parameter by parameter.
    pub fn grads(&self) -> GradShards<'_> {
        GradShards {
            z: self,
            pending: self
                .units
                .iter()
                .map(|u| vec![None; u.params.len()])
                .collect(),
            sums: vec![None; self.units.len()],
        }
    }

    /// torch `clip_grad_norm_` over the whole gradients that `shards` are this rank's runs of
    /// (the squares summed over the ranks), divided by `loss_scale`.
    pub fn clip(&self, shards: &[Tensor], loss_scale: f64, max_norm: f64) -> Result<Clip> {
        let total = self.reduce.all_reduce_sum(&sum_squares(shards)?)?; // (1,)
        let norm = (total.sqrt()? / loss_scale)?;
        let factor = match max_norm > 0. {
            // min(1, max_norm / (norm + 1e-6)) / loss_scale, as clip_coefficient.
            true => (norm.affine(1., 1e-6)?.recip()? * max_norm)?.clamp(0f32, 1f32)?,
            false => norm.ones_like()?,
        };
        Ok(Clip::Device(Tensor::cat(
            &[norm, (factor / loss_scale)?],
            0,
        )?))
    }
}

/// Gradients collected unit by unit: a unit complete on this rank is reduce-scattered at
/// once (every rank completes the units in the same order, so the collectives pair up) and
/// added to its shard's sum.
pub struct GradShards<'a> {
    z: &'a Sharded,
    pending: Vec<Vec<Option<Tensor>>>,
    sums: Vec<Option<Tensor>>,
}

impl GradShards<'_> {
    /// Parameter `index`'s gradient (any float dtype).
    pub fn add(&mut self, index: usize, grad: Tensor) -> Result<()> {
        let (u, k) = self.z.place[index];
        self.pending[u][k] = Some(match self.pending[u][k].take() {
            Some(earlier) => (earlier.to_dtype(DType::F32)? + grad.to_dtype(DType::F32)?)?,
            None => grad,
        });
        if self.pending[u].iter().all(Option::is_some) {
            self.send(u)?;
        }
        Ok(())
    }

    /// Reduce-scatters unit `u`'s pending gradients (zeros for any it did not get).
    fn send(&mut self, u: usize) -> Result<()> {
        let unit = &self.z.units[u];
        let dev = self.z.masters[u].device().clone();
        let grads = std::mem::replace(&mut self.pending[u], vec![None; unit.params.len()]);
        let grads = grads
            .into_iter()
            .zip(&unit.shapes)
            .map(|(g, shape)| g.map_or_else(|| Tensor::zeros(shape, DType::F32, &dev), Ok))
            .collect::<Result<Vec<_>>>()?;
        let flat = self.z.flat(u, &grads)?;
        drop(grads);
        let mine = self
            .z
            .reduce
            .reduce_scatter_sum(&flat, self.z.rank, self.z.size)?; // (S,)
        self.sums[u] = Some(match self.sums[u].take() {
            Some(sum) => (sum + mine)?,
            None => mine,
        });
        Ok(())
    }

    /// Each unit's summed gradient shard (S,) f32, in unit order: units left incomplete are
    /// sent now, in unit order, on every rank alike.
    pub fn finish(mut self) -> Result<Vec<Tensor>> {
        for u in 0..self.z.units.len() {
            let started = self.pending[u].iter().any(Option::is_some);
            if started || self.sums[u].is_none() {
                self.send(u)?;
            }
        }
        Ok(self.sums.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn layers_are_read_from_block_names() {
        assert_eq!(layer_of("h.3.attn.c_attn.weight"), Some(3));
        assert_eq!(
            layer_of("transformer.h.12.mlp.dense_4h_to_h.bias"),
            Some(12)
        );
        assert_eq!(layer_of("wte.weight"), None);
        assert_eq!(layer_of("ln_f.bias"), None);
    }

    /// Rank 1 of 2 whose peer holds the same values: the sums are the values doubled.
    struct TwinRanks;

    impl AllReduce for TwinRanks {
        fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
            x * 2.
        }

        fn describe(&self) -> String {
            "twin".into()
        }
    }

    /// Shards are runs of the padded flat units, a gradient's shard is the rank's run of the
    /// summed unit, and the norm sums the squares over the ranks.
    #[test]
    fn shards_are_runs_of_padded_units() -> Result<()> {
        let dev = Device::Cpu;
        let names: Vec<String> = ["wte.weight", "h.0.w", "h.0.b", "ln_f.bias"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let params = vec![
            Tensor::arange(0f32, 4., &dev)?.reshape((2, 2))?,
            Tensor::arange(10f32, 13., &dev)?,
            Tensor::arange(20f32, 22., &dev)?,
            Tensor::new(&[30f32], &dev)?,
        ];
        let z = Sharded::new(&names, &params, 1, 2, Arc::new(TwinRanks))?;
        assert_eq!(z.block_unit(0), Some(1));
        // Unit 0 = wte + ln_f: 5 values, 3 a rank (one of padding); unit 1 = h.0: 5 values.
        assert_eq!(z.masters[0].as_tensor().to_vec1::<f32>()?, [3., 30., 0.]);
        assert_eq!(z.masters[1].as_tensor().to_vec1::<f32>()?, [20., 21., 0.]);
        let mut g = z.grads();
        for (i, p) in params.iter().enumerate().rev() {
            g.add(i, p.clone())?;
        }
        let shards = g.finish()?;
        assert_eq!(shards[0].to_vec1::<f32>()?, [6., 60., 0.]);
        assert_eq!(shards[1].to_vec1::<f32>()?, [40., 42., 0.]);
        let clip = z.clip(&shards, 1., 0.)?.read()?;
        assert!((clip.0 - (2. * (36f64 + 3600. + 1600. + 1764.)).sqrt()).abs() < 1e-3);
        assert_eq!(clip.1, 1.);
        Ok(())
    }
}
