//! What every [`AllReduce`] backend must do, as one check that each backend's tests call: TCP
//! over CPU ranks (threads, in CI), NCCL on one GPU (a one-rank communicator, with the kernels'
//! GPU tests) and NCCL over two GPUs (the two-GPU smoke stage). Rank `r` of `size` holds
//! `(r + 1) · base`, integers small enough to be exact in bf16, so every sum is exact.

use super::collective::TcpAllReduce;
use super::AllReduce;
use candle_core::{DType, Device, Tensor};
use std::time::Duration;

/// The shapes every collective is checked at: 1-D, 2-D and 3-D.
const SHAPES: [&[usize]; 3] = [&[12], &[3, 4], &[2, 3, 4]];

/// Integers in -8..=8 of `shape`, the same on every rank for the same `salt`.
fn base(shape: &[usize], salt: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + salt * 13) % 17) as f32 - 8.)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// Rank `rank`'s input: `(rank + 1) · base` in `dtype` on `dev`.
fn mine(shape: &[usize], salt: usize, rank: usize, dtype: DType, dev: &Device) -> Tensor {
    (base(shape, salt) * (rank + 1) as f64)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

/// The values of `t` on the host, as f32, flat.
fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Checks the shape, dtype and values of `got` against `want` (f32, on the CPU).
fn same(got: &Tensor, want: &Tensor, dtype: DType, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    assert_eq!(values(got), values(want), "{what}: values");
}

/// Runs the contract on rank `rank` of `size` (every rank calls it, in the same order) for
/// each dtype of `dtypes`, on `dev`.
pub fn check(reduce: &dyn AllReduce, rank: usize, size: usize, dtypes: &[DType], dev: &Device) {
    let total = (size * (size + 1) / 2) as f64; // Σ (r + 1)
    for &dtype in dtypes {
        for (salt, shape) in SHAPES.iter().enumerate() {
            let what = format!("{} {dtype:?} {shape:?}", reduce.describe());
            let want = (base(shape, salt) * total).unwrap();
            let x = mine(shape, salt, rank, dtype, dev);
            same(&reduce.all_reduce_sum(&x).unwrap(), &want, dtype, &what);
            let started = reduce.start_sum(x.clone()).unwrap();
            reduce.wait_sums().unwrap();
            same(&started, &want, dtype, &format!("{what} start_sum"));
        }
        views(reduce, rank, total, dtype, dev);
        sizes(reduce, rank, total, dtype, dev);
        scatter_and_gather(reduce, rank, size, dtype, dev);
    }
}

/// A transposed (strided) view and a narrowed one (an offset into its buffer) sum as the
/// tensors they show.
fn views(reduce: &dyn AllReduce, rank: usize, total: f64, dtype: DType, dev: &Device) {
    let what = format!("{} {dtype:?}", reduce.describe());
    let x = mine(&[3, 4], 7, rank, dtype, dev);
    let want = (base(&[3, 4], 7) * total).unwrap();
    let t = x.t().unwrap();
    same(
        &reduce.all_reduce_sum(&t).unwrap(),
        &want.t().unwrap(),
        dtype,
        &format!("{what} transposed"),
    );
    let n = x.narrow(0, 1, 2).unwrap();
    same(
        &reduce.all_reduce_sum(&n).unwrap(),
        &want.narrow(0, 1, 2).unwrap(),
        dtype,
        &format!("{what} narrowed"),
    );
}

/// Sums of a decode step's size, of several blocks' and past the one-shot sums' 512 KiB, each
/// three times in a row and interleaved (the one-shot kernel's flags and alternating slots).
fn sizes(reduce: &dyn AllReduce, rank: usize, total: f64, dtype: DType, dev: &Device) {
    let what = format!("{} {dtype:?}", reduce.describe());
    for round in 0..3 {
        for (salt, n) in [8, 4096, 16 * 4096 + 8, 300_000].into_iter().enumerate() {
            let x = mine(&[n], salt + round, rank, dtype, dev);
            let want = (base(&[n], salt + round) * total).unwrap();
            let got = reduce.all_reduce_sum(&x).unwrap();
            same(&got, &want, dtype, &format!("{what} ({n},) round {round}"));
        }
    }
}

/// ZeRO's collectives: rank r gets run r of the sum of (size·S,); the gather is every rank's
/// (S,) in rank order; a reduce-scatter of a 2-D or 3-D tensor is refused.
fn scatter_and_gather(
    reduce: &dyn AllReduce,
    rank: usize,
    size: usize,
    dtype: DType,
    dev: &Device,
) {
    let what = format!("{} {dtype:?}", reduce.describe());
    let s = 6;
    let total = (size * (size + 1) / 2) as f64;
    let x = mine(&[size * s], 3, rank, dtype, dev);
    let want = (base(&[size * s], 3) * total)
        .unwrap()
        .narrow(0, rank * s, s)
        .unwrap();
    let got = reduce.reduce_scatter_sum(&x, rank, size).unwrap();
    same(&got, &want, dtype, &format!("{what} reduce-scatter"));
    for shape in &SHAPES[1..] {
        let stacked: Vec<usize> = std::iter::once(size * shape[0])
            .chain(shape[1..].iter().copied())
            .collect();
        let x = mine(&stacked, 4, rank, dtype, dev);
        let err = reduce.reduce_scatter_sum(&x, rank, size).unwrap_err();
        assert!(err.to_string().contains("flat"), "{what} {shape:?}: {err}");
    }
    for (salt, shape) in SHAPES.iter().enumerate() {
        let x = mine(shape, salt, rank, dtype, dev);
        let n = x.elem_count();
        let parts: Vec<Tensor> = (0..size)
            .map(|r| {
                mine(shape, salt, r, DType::F32, &Device::Cpu)
                    .flatten_all()
                    .unwrap()
            })
            .collect();
        let want = Tensor::cat(&parts, 0).unwrap();
        let got = reduce.all_gather(&x, rank, size).unwrap();
        assert_eq!(got.dims(), &[n * size], "{what} all-gather {shape:?}");
        same(&got, &want, dtype, &format!("{what} all-gather {shape:?}"));
    }
}

/// Three CPU ranks (threads) over TCP keep the contract of every backend: shapes, dtypes and
/// exact sums of 1-D, 2-D and 3-D tensors, views, ZeRO's reduce-scatter and all-gather.
#[test]
fn tcp_collectives_keep_the_backend_contract() {
    let listener = TcpAllReduce::listen([127, 0, 0, 1].into()).unwrap();
    let addr = listener.local_addr().unwrap();
    let size = 3;
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    let ranks: Vec<_> = (1..size)
        .map(|r| {
            std::thread::spawn(move || {
                let c = TcpAllReduce::connect(addr, r).unwrap();
                check(&c, r, size, &dtypes, &Device::Cpu);
            })
        })
        .collect();
    let root = TcpAllReduce::serve(listener, size, Duration::from_secs(10)).unwrap();
    check(&root, 0, size, &dtypes, &Device::Cpu);
    for r in ranks {
        r.join().unwrap();
    }
}
