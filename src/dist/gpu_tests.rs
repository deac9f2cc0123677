//! The NCCL collectives on GPUs, against the contract every backend keeps (`contract.rs`):
//! one rank on one GPU runs with the kernels' GPU tests (`scripts/gpu_checks.sh kernels`, any
//! single GPU), two ranks on two GPUs in the two-GPU smoke stage (`gpu_checks.sh multi-smoke`).
//! Without a GPU they fail; they do not skip.

use super::contract;
use super::group::open;
use super::nccl::NcclAllReduce;
use super::AllReduce;
use crate::device::DeviceSpec;
use candle_core::{DType, Device, Tensor};

const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Rank `rank` of `size` on GPU `rank`, opened as a rank of `bench --tp` opens it, runs the
/// contract.
fn rank_checks_the_contract(rank: usize, size: usize, id: &[u8]) {
    let dev = open(DeviceSpec::Cuda(rank)).expect("a GPU for every rank");
    let mut nccl = NcclAllReduce::join(&dev, rank, size, id).unwrap();
    nccl.map_peer_buffers(&dev, rank, size, true).unwrap();
    let how = nccl.describe();
    assert!(
        how.contains("one-shot"),
        "rank {rank}: no one-shot sums ({how})"
    );
    contract::check(&nccl, rank, size, &DTYPES, &dev);
    sum_add_norm_is_the_composed_ops(&nccl, rank, &dev);
    pushing_gemv_is_the_gemv_then_the_sum(&nccl, &dev);
    if size == 2 {
        started_sums_cross_by_copy_engines(&nccl, rank, &dev);
    }
}

/// Two ranks of one host: started sums go through the copy engines once prepared, step after
/// step (the flags' epochs), with a tensor past the region's room summed by NCCL in the same
/// step; every sum exact.
fn started_sums_cross_by_copy_engines(nccl: &NcclAllReduce, rank: usize, dev: &Device) {
    let region = 3 << 20; // bytes: the step below overflows it on purpose
    nccl.prepare_started_sums(region).unwrap();
    let how = nccl.describe();
    assert!(how.contains("copy-engine"), "rank {rank}: {how}");
    let sizes = [1usize, 1000, 300_000, 500_000]; // f32: 4 B, 4 kB, 1.2 MB, 2 MB (NCCL's)
    for step in 0..3 {
        let mine: Vec<Tensor> = sizes
            .iter()
            .map(|&n| {
                let v: Vec<f32> = (0..n)
                    .map(|i| ((i + step) % 13) as f32 * (rank + 1) as f32)
                    .collect();
                Tensor::from_vec(v, n, dev).unwrap()
            })
            .collect();
        let started: Vec<Tensor> = mine
            .iter()
            .map(|t| nccl.start_sum(t.copy().unwrap()).unwrap())
            .collect();
        nccl.wait_sums().unwrap();
        for (got, &n) in started.iter().zip(&sizes) {
            let want: Vec<f32> = (0..n).map(|i| ((i + step) % 13) as f32 * 3.).collect();
            assert_eq!(
                got.to_vec1::<f32>().unwrap(),
                want,
                "rank {rank} step {step} ({n},)"
            );
        }
    }
}

/// The one-shot sum fused with the residual add and the next LayerNorm gives, bit for bit,
/// the sum and then `kernels::add_layer_norm`; where it does not apply (a row not in 16-byte
/// vectors, over the one-shot size) it says so with None. Plain sums of other sizes run in
/// between: the two kernels share the epochs of one buffer.
fn sum_add_norm_is_the_composed_ops(nccl: &NcclAllReduce, rank: usize, dev: &Device) {
    let eps = 1e-5;
    // (rows, C): a decode step (1 and 16 rows of bloom-7b1), several rows a block (40 > 32
    // blocks), gpt2's width, a row not in whole vectors, and over 512 KiB.
    let shapes = [(1, 4096), (16, 4096), (40, 768), (3, 1002), (160, 4096)];
    for dtype in DTYPES {
        for (salt, &(rows, c)) in shapes.iter().enumerate() {
            let what = format!("{dtype:?} ({rows}, {c})");
            let normal = |shape: &[usize], mean: f64| {
                Tensor::randn(mean, 1., shape, &Device::Cpu)
                    .and_then(|t| t.to_dtype(dtype))
                    .and_then(|t| t.to_device(dev))
                    .unwrap()
            };
            // Rank r's share (r + 1)·(integers), so the sum is exact in every dtype.
            let ints: Vec<f32> = (0..rows * c)
                .map(|i| (((i * 7 + salt) % 17) as f32 - 8.) * (rank + 1) as f32)
                .collect();
            let base = Tensor::from_vec(ints, (rows, c), &Device::Cpu)
                .and_then(|t| t.to_dtype(dtype)?.to_device(dev))
                .unwrap();
            let (r, w, b) = (normal(&[rows, c], 0.), normal(&[c], 1.), normal(&[c], 0.));
            let fused = nccl.sum_add_layer_norm(&base, &r, &w, &b, eps).unwrap();
            nccl.all_reduce_sum(&normal(&[8 + 8 * salt], 0.)).unwrap();
            let sum = nccl.all_reduce_sum(&base).unwrap();
            let (s, y) = crate::kernels::add_layer_norm(&r, &sum, &w, &b, eps)
                .unwrap()
                .expect("the add + norm kernel");
            let whole = c * dtype.size_in_bytes() % 16 == 0;
            let small = rows * c * dtype.size_in_bytes() <= crate::kernels::ONESHOT_CAP;
            let Some((fs, fy)) = fused else {
                assert!(!(whole && small), "{what}: no fused kernel");
                continue;
            };
            assert!(whole && small, "{what}: fused where it should not apply");
            assert_eq!(bits(&fs), bits(&s), "{what}: the sum");
            assert_eq!(bits(&fy), bits(&y), "{what}: the norm");
        }
    }
}

/// The decode GEMV that pushes its output to the ranks, then the receiving sum + add + norm,
/// give bit for bit the GEMV, then the one-shot sum + add + norm; where it does not apply
/// (5 rows, a row not in 16-byte vectors, f32) it says so with None and runs nothing, and the
/// next sums still agree (their epochs did not move).
fn pushing_gemv_is_the_gemv_then_the_sum(nccl: &NcclAllReduce, dev: &Device) {
    use crate::kernels::{gemv, Act, PendingGemv};
    let eps = 1e-5;
    // (rows, in, out): bloom-7b1's dense and 4h -> h at tp 2, 4 rows, gpt2's width, then three
    // it refuses.
    let shapes = [
        (1, 2048, 4096),
        (1, 8192, 4096),
        (4, 4096, 4096),
        (3, 1024, 768),
        (5, 256, 4096),
        (2, 256, 4100),
    ];
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for &(m, k, n) in &shapes {
            let what = format!("{dtype:?} ({m}, {k}) x ({n}, {k})");
            let normal = |shape: &[usize], mean: f64, std: f64| {
                Tensor::randn(mean, std, shape, &Device::Cpu)
                    .and_then(|t| t.to_dtype(dtype)?.to_device(dev))
                    .unwrap()
            };
            let (x, w, bias) = (
                normal(&[m, k], 0., 1.),
                normal(&[n, k], 0., 0.02),
                normal(&[n], 0., 1.),
            );
            let (r, lw, lb) = (
                normal(&[m, 1, n], 0., 1.),
                normal(&[n], 1., 0.1),
                normal(&[n], 0., 0.1),
            );
            let pending = PendingGemv {
                x: &x,
                w: &w,
                bias: &bias,
            };
            let pushed = nccl
                .gemv_sum_add_layer_norm(&pending, &r, (&lw, &lb, eps))
                .unwrap();
            // The pushing GEMV has gemv's one-column layout; at one row `gemv-wide` sums
            // in another order, so the reference is taken without it.
            set_paths_but_wide(true);
            let y = gemv(&x, &w, &bias, Act::None).unwrap();
            set_paths_but_wide(false);
            let applies = dtype != DType::F32 && m <= 4 && n % 8 == 0;
            let Some((ps, py)) = pushed else {
                assert!(!applies, "{what}: no pushing GEMV");
                continue;
            };
            assert!(applies, "{what}: pushed where it should not apply");
            let y = y.expect("the GEMV").reshape((m, 1, n)).unwrap();
            let (s, yn) = nccl
                .sum_add_layer_norm(&y, &r, &lw, &lb, eps)
                .unwrap()
                .expect("the one-shot sum + add + norm");
            assert_eq!(bits(&ps), bits(&s), "{what}: the sum");
            assert_eq!(bits(&py), bits(&yn), "{what}: the norm");
            assert_eq!(ps.dims(), r.dims(), "{what}: the residual's shape");
        }
    }
}

/// Every fused path but `gemv-wide` (`on`), or every path again.
fn set_paths_but_wide(on: bool) {
    use crate::kernels::{set_enabled, Fused};
    use clap::ValueEnum as _;
    let paths: Vec<Fused> = match on {
        true => Fused::value_variants()
            .iter()
            .copied()
            .filter(|f| !matches!(f, Fused::All | Fused::None | Fused::Step | Fused::GemvWide))
            .collect(),
        false => vec![Fused::All],
    };
    set_enabled(&paths);
}

/// The values of `t` as f32 (exact for every float dtype), flat.
fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

/// One rank: the sum, the started sum, the reduce-scatter and the all-gather hand back the
/// tensor with its shape (1-D, 2-D, 3-D, views) and dtype: what a shape bug of any collective
/// breaks, on any single GPU.
#[test]
fn nccl_collectives_keep_the_contract_on_one_rank() {
    let id = NcclAllReduce::new_id().unwrap();
    rank_checks_the_contract(0, 1, &id);
}

/// Two ranks on two GPUs (a thread a rank): the sums' values cross between the GPUs, small
/// ones through the one-shot kernel (peer access), the others through NCCL.
#[test]
#[ignore = "needs two GPUs: scripts/gpu_checks.sh multi-smoke runs it"]
fn nccl_collectives_keep_the_contract_over_two_gpus() {
    let id = NcclAllReduce::new_id().unwrap();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let id = id.clone();
            std::thread::spawn(move || rank_checks_the_contract(rank, 2, &id))
        })
        .collect();
    for r in ranks {
        r.join().expect("a rank failed its checks");
    }
}

/// Sums a CUDA graph replays back to back, per timing.
const GRAPHED_SUMS: usize = 50;

/// The time of one sum of a decode step's sizes inside a CUDA graph over two GPUs, NCCL's
/// all-reduce against the one-shot kernel: printed for docs/perf-notes.md (a measurement, run
/// by `scripts/multi_measure.sh tp-decode`; the sums' values are checked, the times are not).
#[test]
#[ignore = "needs two GPUs: scripts/multi_measure.sh tp-decode runs it"]
fn sum_latency_over_two_gpus() {
    use crate::kernels::{set_enabled, Fused};
    for oneshot in [false, true] {
        set_enabled(&[
            Fused::Graph,
            if oneshot {
                Fused::Oneshot
            } else {
                Fused::Decode
            },
        ]);
        let id = NcclAllReduce::new_id().unwrap();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let id = id.clone();
                std::thread::spawn(move || time_graphed_sums(rank, 2, &id))
            })
            .collect();
        for r in ranks {
            r.join().expect("a rank failed");
        }
    }
    set_enabled(&[Fused::All]);
}

/// Rank `rank`'s part of [`sum_latency_over_two_gpus`]: rank 0 prints µs a sum.
fn time_graphed_sums(rank: usize, size: usize, id: &[u8]) {
    let dev = open(DeviceSpec::Cuda(rank)).unwrap();
    let mut nccl = NcclAllReduce::join(&dev, rank, size, id).unwrap();
    nccl.map_peer_buffers(&dev, rank, size, true).unwrap();
    for n in [4096, 16 * 4096, 256 * 1024] {
        let x =
            (candle_core::Tensor::ones(n, DType::BF16, &dev).unwrap() * (rank + 1) as f64).unwrap();
        let y = nccl
            .all_reduce_sum(&x)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        assert_eq!(y.min(0).unwrap().to_scalar::<f32>().unwrap(), 3.);
        assert_eq!(y.max(0).unwrap().to_scalar::<f32>().unwrap(), 3.);
        let _params = crate::kernels::param_cache(&dev);
        let graph = crate::kernels::capture(&dev, || {
            for _ in 0..GRAPHED_SUMS {
                nccl.all_reduce_sum(&x)?;
            }
            Ok(())
        })
        .unwrap()
        .expect("a CUDA graph");
        let replay = |times: usize| {
            for _ in 0..times {
                graph.launch().unwrap();
            }
            dev.synchronize().unwrap();
        };
        replay(5);
        let start = std::time::Instant::now();
        replay(20);
        let us = start.elapsed().as_secs_f64() * 1e6 / (20 * GRAPHED_SUMS) as f64;
        if rank == 0 {
            println!(
                "{}: {} KiB bf16: {us:.2} µs a sum (graphed)",
                nccl.describe(),
                n * 2 / 1024
            );
        }
    }
}
