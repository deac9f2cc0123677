#!/usr/bin/env python3
"""Where a decode step kernel's time goes (`--fused step`, TB_STEP_TRACE=<file>): per stage
(qkv, attention, proj, fc, fc2), the medians over the layers of
  work  = the last block's arrival at the stage's barrier - the previous barrier's release
          (the earliest departure), i.e. the slowest block's stage;
  wait  = the median block's departure - the last arrival (the barrier's own latency);
and the kernel's span (first start to last end). Usage: step_trace.py FILE [FILE...]"""
import statistics
import struct
import sys

STAGES = ["qkv", "attention", "proj", "fc", "fc2"]


def summarise(path):
    raw = open(path, "rb").read()
    grid, layers = struct.unpack_from("<QQ", raw)
    t = struct.unpack_from(f"<{(len(raw) - 16) // 8}Q", raw, 16)
    rows = 2 + 10 * layers
    at = lambda r: t[r * grid:(r + 1) * grid]  # noqa: E731 (row r of the (rows, grid) table)
    start, end = at(0), at(rows - 1)
    release = min(start)
    work = {s: [] for s in STAGES}
    wait = {s: [] for s in STAGES}
    for k in range(1, 5 * layers + 1):
        arrive, depart = at(2 * k - 1), at(2 * k)
        stage = STAGES[(k - 1) % 5]
        work[stage].append((max(arrive) - release) / 1e3)
        wait[stage].append((statistics.median(depart) - max(arrive)) / 1e3)
        release = min(depart)
    span = (max(end) - min(start)) / 1e3
    print(f"{path}: grid {grid}, {layers} layers, kernel span {span:.1f} us "
          f"({span / layers:.2f} us a layer), final norm {(max(end) - release) / 1e3:.2f} us")
    print("stage       work us (median, max)   barrier us (median, max)")
    for s in STAGES:
        print(f"{s:10s}  {statistics.median(work[s]):6.2f} {max(work[s]):6.2f}          "
              f"{statistics.median(wait[s]):6.2f} {max(wait[s]):6.2f}")


for p in sys.argv[1:]:
    summarise(p)
