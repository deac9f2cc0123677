#!/usr/bin/env python3
"""Where a graphed decode step's time goes, kernel by kernel, from kernel_trace's CSV.

usage: kernel_timeline.py TRACE.csv [--layer-period N] [--skip S]

Each graph launch (one correlation id) is one step; the launches with the most common kernel
count are the decode steps. For kernel i of a step, in start order, the medians over steps of:
  end_delta = end_i - end_(i-1)   its share of the step's critical path (each kernel waits on
                                  the one before, so the step ends when the last one does);
  lead      = end_(i-1) - start_i how long it was resident before the kernel before had ended
                                  (programmatic launch: its weights may load then);
  dur       = end_i - start_i.
Printed: the step's span, the gap between consecutive steps (the graph launches' own
latency), each kernel name's share summed over the step, and one layer's
kernels position by position (the middle one, `--layer-period` kernels long, else guessed
from the repeating names).
"""
import argparse
import collections
import csv
import statistics


def steps_of(path):
    """The decode steps' kernels: lists of (name, start, end, grid, block, regs), start order."""
    launches = collections.defaultdict(list)
    try:
        with open(path, newline="") as f:
            for line, row in enumerate(csv.reader(f), 1):
                try:
                    name, start, end, graph, _node, corr, grid, block, regs = row[:9]
                    if graph == "0":
                        continue
                    launches[corr].append((name, int(start), int(end), int(grid), int(block), int(regs)))
                except ValueError:
                    raise SystemExit(f"kernel_timeline: {path}:{line}: not a kernel_trace line")
    except OSError as e:
        raise SystemExit(f"kernel_timeline: {e.strerror}: {path} (TB_KERNEL_TRACE of kernel_trace.c)")
    if not launches:
        raise SystemExit(f"kernel_timeline: no graphed kernels in {path} (was the step graphed, `--fused graph`?)")
    sizes = collections.Counter(len(k) for k in launches.values())
    size = sizes.most_common(1)[0][0]
    steps = [sorted(k, key=lambda r: r[1]) for k in launches.values() if len(k) == size]
    names = [r[0] for r in steps[0]]
    return [s for s in steps if [r[0] for r in s] == names], sizes


def short(name):
    """The kernel's name without its dtype suffix."""
    for suffix in ("_bf16", "_f16", "_f32"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def period_of(names):
    """The shortest period p with names[i] == names[i + p] over the middle half."""
    n = len(names)
    for p in range(2, n // 2):
        lo, hi = n // 4, 3 * n // 4
        if all(names[i] == names[i + p] for i in range(lo, hi - p)):
            return p
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--layer-period", type=int)
    ap.add_argument("--skip", type=int, default=20, help="steps left out first (warm-up)")
    args = ap.parse_args()
    steps, sizes = steps_of(args.trace)
    steps = steps[args.skip :] if len(steps) > args.skip + 10 else steps
    n = len(steps[0])
    med = statistics.median
    us = lambda v: v / 1000.0
    span = med(s[-1][2] - s[0][1] for s in steps)
    print(f"steps: {len(steps)} of {n} kernels (launch sizes: {dict(sizes.most_common(4))})")
    print(f"step span (first start to last end): {us(span):.2f} us")
    ordered = sorted(steps, key=lambda s: s[0][1])
    gaps = [b[0][1] - a[-1][2] for a, b in zip(ordered, ordered[1:])]
    gaps = [g for g in gaps if g < span]  # consecutive steps only
    if gaps:
        print(f"between steps (a step's last end to the next one's first start): {us(med(gaps)):.2f} us")
    rows = []
    for i in range(n):
        dur = med(s[i][2] - s[i][1] for s in steps)
        if i == 0:
            delta, lead = dur, 0.0
        else:
            delta = med(s[i][2] - s[i - 1][2] for s in steps)
            lead = med(s[i - 1][2] - s[i][1] for s in steps)
        r = steps[0][i]
        rows.append((short(r[0]), us(delta), us(lead), us(dur), r[3], r[4], r[5]))
    by_name = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for name, delta, _lead, dur, *_ in rows:
        by_name[name][0] += 1
        by_name[name][1] += delta
        by_name[name][2] += dur
    print("\nby kernel: count, sum of end_delta (us), sum of dur (us)")
    for name, (c, d, u) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:40s} {c:4d} {d:9.2f} {u:9.2f}")
    p = args.layer_period or period_of([r[0] for r in rows])
    if p:
        mid = (n // 2 // p) * p
        first = next(j for j in range(mid, mid + p) if rows[j][0] == rows[p][0]) if n > p else mid
        print(f"\none layer (period {p}, kernels {first}..{first + p - 1}):")
        print(f"  {'kernel':40s} {'end_delta':>9s} {'lead':>7s} {'dur':>7s} {'grid':>6s} {'block':>5s} {'regs':>4s}")
        for name, delta, lead, dur, grid, block, regs in rows[first : first + p]:
            print(f"  {name:40s} {delta:9.2f} {lead:7.2f} {dur:7.2f} {grid:6d} {block:5d} {regs:4d}")
        print(f"  layer sum of end_delta: {sum(r[1] for r in rows[first:first + p]):.2f} us")
    print("\nfirst and last kernels of the step:")
    for name, delta, lead, dur, grid, block, regs in rows[:4] + rows[-6:]:
        print(f"  {name:40s} {delta:9.2f} {lead:7.2f} {dur:7.2f} {grid:6d} {block:5d} {regs:4d}")


if __name__ == "__main__":
    main()
