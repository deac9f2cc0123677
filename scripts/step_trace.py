#!/usr/bin/env python3
"""Where a decode step kernel's time goes (`--fused step`, TB_STEP_TRACE=<file>): per stage
(qkv, attention, proj, fc, fc2), the medians over the layers of
  work  = the last block's arrival at the stage's barrier - the previous barrier's release
          (the earliest departure), i.e. the slowest block's stage;
  wait  = the median block's departure - the last arrival (the barrier's own latency);
and the kernel's span (first start to last end). Traces with two marks a stage (rows after the
barriers') also split each stage's work at its marks, the slowest block's times from the
previous barrier's release, medians over the layers:
  qkv, fc:   the normed input in shared memory | the weights' copy waited for
  attention: the scores' max | their exp-sum
  proj:      the heads merged | the weights' copy waited for
  fc2:       the input in shared memory | the weights' copy waited for
Usage: step_trace.py FILE [FILE...]"""
import statistics
import struct
import sys

STAGES = ["qkv", "attention", "proj", "fc", "fc2"]


def summarise(path):
    raw = open(path, "rb").read()
    grid, layers = struct.unpack_from("<QQ", raw)
    t = struct.unpack_from(f"<{(len(raw) - 16) // 8}Q", raw, 16)
    rows = 2 + 10 * layers
    marked = len(t) >= (2 + 20 * layers) * grid
    at = lambda r: t[r * grid:(r + 1) * grid]  # noqa: E731 (row r of the (rows, grid) table)
    start, end = at(0), at(rows - 1)
    release = min(start)
    work = {s: [] for s in STAGES}
    wait = {s: [] for s in STAGES}
    marks = {s: ([], []) for s in STAGES}
    for k in range(1, 5 * layers + 1):
        arrive, depart = at(2 * k - 1), at(2 * k)
        stage = STAGES[(k - 1) % 5]
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
    print("stage       work us (median, max)   barrier us (median, max)")
    for s in STAGES:
        print(f"{s:10s}  {statistics.median(work[s]):6.2f} {max(work[s]):6.2f}          "
              f"{statistics.median(wait[s]):6.2f} {max(wait[s]):6.2f}")
    if marked:
        print("stage       mark 1 us, mark 2 us (slowest block from the release, medians)")
        for s in STAGES:
            a, b = marks[s]
            print(f"{s:10s}  {statistics.median(a):6.2f} {statistics.median(b):6.2f}")


for p in sys.argv[1:]:
    summarise(p)
