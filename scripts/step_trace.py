#!/usr/bin/env python3
"""Where a decode step kernel's time goes (`--fused step`, TB_STEP_TRACE=<file>): per stage,
the medians over the layers of
  work  = the last block's arrival at the stage's barrier - the previous barrier's release
          (the earliest departure), i.e. the slowest block's stage;
  wait  = the median block's departure - the last arrival (the barrier's own latency);
and the kernel's span (first start to last end). Traces with two marks a stage (rows after the
barriers') also split each stage's work at its marks, the slowest block's times from the
previous barrier's release, medians over the layers. Three stages a layer (a header of three
words, the third 3; the kernel of branch step4, results/h200/step-run90..94):
  A (LN1 + qkv):            the normed input in shared memory | qkv's copy waited for
  B (attention + proj):     the unit's partials written | its head merged (after the head's wait)
  C (LN2 + fc + fc2 share): the normed input in shared memory | fc's outputs in shared memory
Five stages a layer (a header of two words, main's decode_step.cu):
  qkv, fc:   the normed input in shared memory | the weights' copy waited for
  attention: the scores' max | their exp-sum
  proj:      the heads merged | the weights' copy waited for
  fc2:       the input in shared memory | the weights' copy waited for
Usage: step_trace.py FILE [FILE...]"""
import statistics
import struct
import sys

FIVE = ["qkv", "attention", "proj", "fc", "fc2"]
THREE = ["A qkv", "B attn+proj", "C fc+fc2"]


def summarise(path):
    raw = open(path, "rb").read()
    if len(raw) < 24:
        sys.exit(f"{path}: not a step trace ({len(raw)} bytes)")
    grid, layers = struct.unpack_from("<QQ", raw)
    if not 0 < grid < 1 << 20 or not 0 < layers <= 64:
        sys.exit(f"{path}: not a step trace (grid {grid}, {layers} layers in its header)")
    n = (len(raw) - 16) // 8
    head = 2 if n % grid == 0 else 3  # (2 + 20·L)·grid words after the header
    stages = FIVE if head == 2 else THREE
    if head == 3 and struct.unpack_from("<Q", raw, 16)[0] != len(THREE):
        sys.exit(f"{path}: not a step trace (its header's third word is not 3 stages a layer)")
    t = struct.unpack_from(f"<{(len(raw) - 8 * head) // 8}Q", raw, 8 * head)
    rows = 2 + 10 * layers
    per = len(stages)
    marked = len(t) >= (2 + 20 * layers) * grid
    at = lambda r: t[r * grid:(r + 1) * grid]  # noqa: E731 (row r of the (rows, grid) table)
    start, end = at(0), at(2 * per * layers + 1)
    release = min(start)
    work = {s: [] for s in stages}
    wait = {s: [] for s in stages}
    marks = {s: ([], []) for s in stages}
    for k in range(1, per * layers + 1):
        arrive, depart = at(2 * k - 1), at(2 * k)
        stage = stages[(k - 1) % per]
        work[stage].append((max(arrive) - release) / 1e3)
        if marked:
            for which in (0, 1):
                row = at(rows + 2 * (k - 1) + which)
                marks[stage][which].append((max(row) - release) / 1e3)
        wait[stage].append((statistics.median(depart) - max(arrive)) / 1e3)
        release = min(depart)
    span = (max(end) - min(start)) / 1e3
    print(f"{path}: grid {grid}, {layers} layers, kernel span {span:.1f} us "
          f"({span / layers:.2f} us a layer), final norm {(max(end) - release) / 1e3:.2f} us")
    print("stage         work us (median, max)   barrier us (median, max)")
    for s in stages:
        print(f"{s:12s}  {statistics.median(work[s]):6.2f} {max(work[s]):6.2f}          "
              f"{statistics.median(wait[s]):6.2f} {max(wait[s]):6.2f}")
    if marked:
        print("stage         mark 1 us, mark 2 us (slowest block from the release, medians)")
        for s in stages:
            a, b = marks[s]
            print(f"{s:12s}  {statistics.median(a):6.2f} {statistics.median(b):6.2f}")


for p in sys.argv[1:]:
    summarise(p)
