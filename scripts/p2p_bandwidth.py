"""What two GPUs of one host move a second, for data parallelism's gradient sum (#34): NCCL's
all-reduce (what `--dp` runs now, SMs doing the work) against a copy-engine copy over NVLink
(what a sum that takes no SMs would run), f32, at gradient-bucket sizes.

  python3 scripts/p2p_bandwidth.py                      # one process: copy engines, both ways at once
  python3 -m torch.distributed.run --nproc-per-node 2 scripts/p2p_bandwidth.py   # NCCL all-reduce

Each size: 3 warm-up operations, then the mean of 10, timed with CUDA events; prints GB/s of
the buffer's bytes (an all-reduce of S bytes over 2 GPUs sends S bytes each way: its algorithm
bandwidth is comparable with one copy's). NCCL_NVLS_ENABLE=0 must be set (shared hosts).
"""
import os

import torch

SIZES_MB = (32, 128, 512)


def timed_ms(op, reps=10):
    for _ in range(3):
        op()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        op()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def copies():
    """cuda:0 -> cuda:1 and cuda:1 -> cuda:0 at once, each on a stream of its device."""
    print("peer access 0<->1:", torch.cuda.can_device_access_peer(0, 1), flush=True)
    for mb in SIZES_MB:
        n = mb * 2**20 // 4
        a0, b1 = torch.randn(n, device="cuda:0"), torch.empty(n, device="cuda:1")
        a1, b0 = torch.randn(n, device="cuda:1"), torch.empty(n, device="cuda:0")
        s0, s1 = torch.cuda.Stream("cuda:0"), torch.cuda.Stream("cuda:1")

        def both():
            with torch.cuda.stream(s0):
                b1.copy_(a0, non_blocking=True)
            with torch.cuda.stream(s1):
                b0.copy_(a1, non_blocking=True)
            s0.synchronize()
            s1.synchronize()

        ms = timed_ms(both)
        print(f"copy engines, {mb} MiB each way at once: {ms:.3f} ms, {mb * 2**20 / ms / 1e6:.1f} GB/s a direction",
              flush=True)


def all_reduce():
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    for mb in SIZES_MB:
        x = torch.randn(mb * 2**20 // 4, device="cuda")
        ms = timed_ms(lambda: dist.all_reduce(x))
        if rank == 0:
            chans = os.environ.get("NCCL_MIN_NCHANNELS", "default")
            print(f"NCCL all-reduce {mb} MiB f32 over {dist.get_world_size()} GPUs (min channels {chans}): "
                  f"{ms:.3f} ms, {mb * 2**20 / ms / 1e6:.1f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "set NCCL_NVLS_ENABLE=0"
    all_reduce() if "RANK" in os.environ else copies()
