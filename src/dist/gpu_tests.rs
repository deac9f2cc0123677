//! The NCCL collectives on GPUs, against the contract every backend keeps (`contract.rs`):
//! one rank on one GPU runs with the kernels' GPU tests (`scripts/gpu_checks.sh kernels`, any
//! single GPU), two ranks on two GPUs in the two-GPU smoke stage (`gpu_checks.sh multi-smoke`).
//! Without a GPU they fail; they do not skip.

use super::collective::NcclAllReduce;
use super::contract;
use super::group::open;
use super::AllReduce;
use crate::device::DeviceSpec;
use candle_core::DType;

const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Rank `rank` of `size` on GPU `rank`, opened as a rank of `bench --tp` opens it, runs the
/// contract.
fn rank_checks_the_contract(rank: usize, size: usize, id: &[u8]) {
    let dev = open(DeviceSpec::Cuda(rank)).expect("a GPU for every rank");
    let mut nccl = NcclAllReduce::join(&dev, rank, size, id).unwrap();
    nccl.map_peer_buffers(&dev, rank, size, true).unwrap();
    if size > 1 {
        let how = nccl.describe();
        assert!(
            how.contains("one-shot"),
            "rank {rank}: no one-shot sums ({how})"
        );
    }
    contract::check(&nccl, rank, size, &DTYPES, &dev);
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
