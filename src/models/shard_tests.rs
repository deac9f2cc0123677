//! Tests of tensor-parallel sharding ([`super::shard`]) that write and read weights
//! ([`super::weights`]): beside both, so neither imports the other back.

use super::shard::*;
use super::weights::{save_checkpoint, RandomInit};
use crate::dist::part;
use crate::dist::test_ranks::on_ranks;
use crate::models::{ModelSpec, WeightSource};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::Init;
use std::sync::Arc;

/// Logits of every position, (B·T, V), of `spec` split over `size` ranks (threads with a
/// TCP all-reduce), as each rank sees them.
fn logits_per_rank(spec: &ModelSpec, source: &WeightSource, size: usize) -> Vec<Vec<f32>> {
    let ids = Tensor::new(
        &[
            [464u32, 3290, 318, 257, 1049, 11, 290],
            [40, 588, 0, 0, 0, 0, 0],
        ],
        &Device::Cpu,
    )
    .unwrap();
    let mask = Tensor::new(
        &[[1u32, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]],
        &Device::Cpu,
    )
    .unwrap();
    let (spec, source) = (spec.clone(), source.clone());
    on_ranks(size, move |tp| {
        let model = spec
            .load_shard(&source, DType::F32, &Device::Cpu, &tp)
            .unwrap();
        let h = model.hidden_states(&ids, &mask).unwrap(); // (B, T, C)
        let h = h.flatten_to(1).unwrap();
        model
            .logits(&h)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    })
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn tensor_parallel_models_compute_the_single_rank_model() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["gpt2-tiny", "bloom-tiny"] {
        let spec = ModelSpec::preset(name).unwrap();
        let random = WeightSource::Random { seed: 3 };
        let want = logits_per_rank(&spec, &random, 1).remove(0);
        // The same weights written as a checkpoint, each rank reading its slices of it.
        let ckpt = dir.path().join(name);
        let record = crate::models::Recorder::default();
        spec.load_recording(&random, DType::F32, &Device::Cpu, Some(record.clone()))
            .unwrap();
        let tensors = std::mem::take(&mut *record.lock().unwrap());
        save_checkpoint(&ckpt, &spec.hf_config(DType::F32), tensors).unwrap();
        // 3 ranks split 4 heads unevenly (1, 1, 2).
        for (size, source) in [
            (2, &random),
            (3, &random),
            (2, &WeightSource::Dir(ckpt.clone())),
        ] {
            let ranks = logits_per_rank(&spec, source, size);
            for (rank, got) in ranks.iter().enumerate() {
                // Partial sums added in another order: fp32 rounding only.
                let d = max_rel_diff(got, &want);
                assert!(
                    d < 1e-5,
                    "{name} tp{size} rank {rank} ({}): rel diff {d}",
                    source.describe()
                );
                assert_eq!(got, &ranks[0], "{name} tp{size}: ranks disagree");
            }
        }
    }
}

#[test]
fn a_rank_keeps_only_its_slice_of_a_weight() {
    // Rows 4..8 of an (8, 4) weight: the rank's tensor must own 16 values, not a view of 32.
    let rows = Sharded {
        inner: RandomInit::new(0, None, &indicatif::ProgressBar::hidden()),
        rank: 1,
        size: 2,
        rule: Arc::new(|_: &str| {
            Some(Split {
                dim: 0,
                blocks: 1,
                unit: 1,
            })
        }),
    };
    let randn = Init::Randn {
        mean: 0.,
        stdev: 1.,
    };
    let t = rows
        .get(Shape::from((8, 4)), "w", randn, DType::F32, &Device::Cpu)
        .unwrap();
    assert_eq!(t.dims(), &[4, 4]);
    let (storage, _) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        panic!("a CPU tensor")
    };
    assert_eq!(cpu.as_slice::<f32>().unwrap().len(), 16);
}

#[test]
fn parts_cover_every_unit_once() {
    for (n, size) in [(25, 2), (12, 4), (7, 3), (4, 4)] {
        let all: Vec<usize> = (0..size).flat_map(|r| part(n, r, size)).collect();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "n {n} size {size}");
    }
    assert_eq!(part(25, 0, 2), 0..12);
    assert_eq!(part(25, 1, 2), 12..25);
}

#[test]
fn a_fused_qkv_split_takes_its_heads_from_each_block() {
    // [q | k | v] of 4 heads of 2 columns each: rank 1 of 2 holds heads 2 and 3 of each.
    let split = Split {
        dim: 1,
        blocks: 3,
        unit: 2,
    };
    assert_eq!(split.ranges(24, 1, 2), vec![4..8, 12..16, 20..24]);
}
