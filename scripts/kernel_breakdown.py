#!/usr/bin/env python3
"""Where one forward's (or training step's) GPU time goes, by op, from ncu CSV exports.

    python3 scripts/kernel_breakdown.py prof/*.csv [--top 8]
    python3 scripts/kernel_breakdown.py prof/gen-*.csv --last-step tb_decode_begin

With --last-step MARKER, only the kernels from the second-to-last kernel whose name contains
MARKER up to the last one: the last whole decode step of a generate call (tb_decode_begin
opens each graphed step), by kernel and grid (a projection's shape shows in its grid).

Each CSV is `ncu -i X.ncu-rep --csv --page raw --print-units base --metrics
gpu__time_duration.sum` of a run with TB_CUDA_PROFILE set (one call's kernels, see
src/profile.rs). Kernel names are mapped to ops by the first matching pattern below (candle's
kernel names, cuBLAS/cuBLASLt, PyTorch's ATen and our fused kernels). ncu runs kernels one at a
time, so the sum is GPU busy time without overlap or launch gaps; the run's wall clock is not
in it.
"""
import argparse
import csv
import os
import re
import sys
from collections import defaultdict

# (op, pattern): first match wins, so the specific ones come first.
OPS = [
    ("attention (fused)", r"flash|fmha|attention|attn_fwd|attn_bwd|tb_attn"),
    ("softmax", r"softmax|SoftMax"),
    ("layer norm", r"layer_?norm|LayerNorm|layernorm|tb_ln|rmsnorm"),
    ("gelu", r"gelu|Gelu|GELU|tanh"),
    ("optimizer", r"adam|Adam|multi_tensor|tb_adamw"),
    ("matmul", r"gemm|Gemm|GEMM|nvjet|cutlass|xmma|cublas|sm90_|sm80_|gemv|splitK"),
    ("nccl", r"nccl|NCCL"),
    ("random", r"curand|rand|philox|Philox|bernoulli|dropout|Dropout|fused_dropout"),
    ("index / gather", r"index|gather|Gather|embedding|Embedding|scatter|Scatter|take|where_|where"),
    ("reduce", r"reduce|Reduce|fast_sum|fast_max|fast_min|fast_arg|sum_|argmax|norm"),
    ("copy / cast", r"copy|Copy|cast|ucopy|to_|contiguous|transpose|cat|fill|Fill"),
    ("elementwise", r"elementwise|badd|bmul|bsub|bdiv|bmaximum|bminimum|affine|uexp|ulog|usqr|usqrt|"
                    r"uneg|urecip|utanh|umul|uadd|powf|elu|relu|cmp|eq_|ne_|lt_|le_|gt_|ge_|add|mul|div|exp|log|sqrt"),
]


def op_of(name):
    for op, pat in OPS:
        if re.search(pat, name):
            return op
    return "other"


def read(path):
    """[(kernel name, grid, ns)] of one ncu CSV export."""
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if not line.startswith("==")))
    if not rows:
        return []
    head = rows[0]
    try:
        name_i, time_i = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
        grid_i = head.index("Grid Size")
    except ValueError:
        sys.exit(f"{path}: not an ncu raw CSV (columns {head[:6]}...)")
    out = []
    for r in rows[1:]:
        try:
            out.append((r[name_i], r[grid_i], float(r[time_i].replace(",", ""))))
        except (ValueError, IndexError):
            continue  # the units row
    return out


def short(name, n=70):
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= n else name[: n - 1] + "…"


def last_step(path, marker, top):
    """The kernels of the last whole step (between the last two MARKER kernels), by name and grid."""
    kernels = read(path)
    label = os.path.basename(path).removesuffix(".csv")
    opens = [i for i, (name, _, _) in enumerate(kernels) if marker in name]
    if len(opens) < 2:
        print(f"\n## {label}: fewer than two '{marker}' kernels: no whole step")
        return
    step = kernels[opens[-2] : opens[-1]]
    total = sum(t for _, _, t in step)
    by = defaultdict(lambda: [0, 0.0])
    for name, grid, t in step:
        by[(name, grid)][0] += 1
        by[(name, grid)][1] += t
    print(f"\n## {label}: the last whole step, {len(step)} kernels, {total / 1e3:.1f} µs GPU time\n")
    print("| kernel | grid | calls | µs | µs a call |\n|---|---|---|---|---|")
    for (name, grid), (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| `{short(name)}` | {grid} | {n} | {t / 1e3:.1f} | {t / 1e3 / n:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=8, help="slowest kernels listed per file")
    ap.add_argument("--last-step", metavar="MARKER", help="the last whole step between MARKER kernels")
    args = ap.parse_args()
    for path in args.csv:
        if args.last_step:
            last_step(path, args.last_step, args.top)
            continue
        kernels = read(path)
        label = os.path.basename(path).removesuffix(".csv")
        if not kernels:
            print(f"\n## {label}: no kernels (the profiler window did not open?)")
            continue
        total = sum(t for _, _, t in kernels)
        by_op = defaultdict(lambda: [0, 0.0])
        by_name = defaultdict(lambda: [0, 0.0])
        for name, _, t in kernels:
            by_op[op_of(name)][0] += 1
            by_op[op_of(name)][1] += t
            by_name[name][0] += 1
            by_name[name][1] += t
        print(f"\n## {label}: {len(kernels)} kernels, {total / 1e6:.3f} ms GPU time\n")
        print("| op | kernels | ms | share |\n|---|---|---|---|")
        for op, (n, t) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
            print(f"| {op} | {n} | {t / 1e6:.3f} | {100 * t / total:.1f}% |")
        print(f"\nslowest kernels:\n\n| kernel | op | calls | ms |\n|---|---|---|---|")
        for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: args.top]:
            print(f"| `{short(name)}` | {op_of(name)} | {n} | {t / 1e6:.3f} |")


if __name__ == "__main__":
    main()
