"""How long one small NCCL all-reduce takes inside a CUDA graph: the floor under --tp decoding,
whose step holds two all-reduces a block (bloom-7b1: 60 of 4096 bf16 values at batch 1).

  python3 -m torch.distributed.run --nproc-per-node 2 scripts/nccl_latency.py [--sizes 4096,65536]

One process a GPU; each size's graph records 60 all-reduces back to back and is replayed 200
times; rank 0 prints microseconds an all-reduce (graph replay time / 60). NCCL_NVLS_ENABLE=0
must be set (shared hosts: scripts/gpu_checks.sh exports it).
"""
import argparse
import os

import torch
import torch.distributed as dist


def per_op_us(x, ops=60, replays=200):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # NCCL's communicator warms up outside the capture
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(ops):
            dist.all_reduce(x)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * ops)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4096,65536", help="bf16 values an all-reduce")
    args = p.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "set NCCL_NVLS_ENABLE=0"
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    for n in [int(s) for s in args.sizes.split(",")]:
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        us = per_op_us(x)
        if rank == 0:
            print(f"all-reduce of {n} bf16 ({2 * n} bytes) over {dist.get_world_size()} GPUs "
                  f"in a CUDA graph: {us:.2f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
