"""How fast the GPU reads memory, as torch's own kernels do it (#37: the decode GEMVs' ceiling).

Times, with CUDA events over 20 repeats after 3 warm ones: a sum over 2 GiB of bf16 (a pure
read), a device-to-device copy of 1 GiB (read + write, the "copy bandwidth" of the notes), and
cuBLAS's one-row products at bloom-7b1's decode shapes (F.linear, x (1, K) against W (N, K)),
back to back over distinct weights of 1 GiB or more (so none from L2; launches overlap).
Prints TB/s of the bytes each must read (the copy: read plus written).
"""

import torch
import torch.nn.functional as F


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def main():
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(0), torch.__version__)
    big = torch.randn(1 << 30, device=dev, dtype=torch.bfloat16)  # 2 GiB
    t = timed(lambda: big.sum(dtype=torch.float32))
    print(f"sum 2 GiB bf16: {t * 1e3:.3f} ms, {big.numel() * 2 / t / 1e12:.3f} TB/s read")
    src = big[: 1 << 29]
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    print(f"copy 1 GiB: {t * 1e3:.3f} ms, {2 * src.numel() * 2 / t / 1e12:.3f} TB/s read + written")
    del dst, src, big
    for n, k in [(12288, 4096), (4096, 4096), (16384, 4096), (4096, 16384), (250880, 4096)]:
        # Distinct weights of at least 1 GiB in all, read one after another: none from L2.
        copies = max(1, (1 << 30) // (n * k * 2))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        t = timed(lambda: [F.linear(x, w) for w in ws]) / copies
        print(f"F.linear (1, {k}) x ({n}, {k})ᵀ: {t * 1e6:.1f} us, {n * k * 2 / t / 1e12:.3f} TB/s")
        del ws


if __name__ == "__main__":
    main()
