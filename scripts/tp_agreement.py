#!/usr/bin/env python3
"""Tensor-parallel runs against their tp=1 run, passage by passage.

    python3 scripts/tp_agreement.py results/h200x2/tp results/h200x4/tp

For every (model, dtype, batch size) in a directory of run logs (*.jsonl or *.jsonl.gz) that
has a tp=1 log, compares each tp=N log with it: accuracy, perplexity, the per-passage
log-likelihood of the target (|ll_N - ll_1| / |ll_1|, max and median) and how many passages'
greedy flag differs. For scale, where tp=1 ran at two batch sizes, the same comparison between
them (bf16 rounds differently with other padding: the noise floor). Prints a markdown table.
Standard library only.
"""
import gzip
import json
import statistics
import sys
from pathlib import Path


def read(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    header = recs[0]
    passages = {
        p["index"]: (p["ll"], p["greedy"])
        for r in recs
        if r["record"] == "batch"
        for p in r["passages"]
    }
    summary = next((r for r in recs if r["record"] == "summary"), {})
    tp = (header.get("tp") or {}).get("size", 1)
    key = (header["model"]["name"], header["dtype"], header["batch_size"])
    return key, tp, passages, summary


def main(dirs):
    print("| dir | model | dtype | batch | compared with tp=1 | passages | accuracy (first / second) | perplexity rel. diff "
          "| ll rel. diff max | ll rel. diff median | greedy flips |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d in dirs:
        runs = {}
        for path in sorted(Path(d).glob("*.jsonl*")):
            key, tp, passages, summary = read(path)
            runs.setdefault(key, {})[tp] = (passages, summary)
        pairs = []
        for key, by_tp in sorted(runs.items()):
            if 1 not in by_tp:
                continue
            pairs += [(key, f"tp {tp}", by_tp[1], run) for tp, run in sorted(by_tp.items()) if tp > 1]
            model, dtype, batch = key
            other = runs.get((model, dtype, 16))
            if batch == 1 and other and 1 in other:
                pairs.append(((model, dtype, "1 vs 16"), "tp 1 (batch 16 vs 1)", other[1], by_tp[1]))
        for key, what, (base, base_sum), (passages, summary) in pairs:
            common = sorted(set(base) & set(passages))
            rel = [abs(passages[i][0] - base[i][0]) / abs(base[i][0]) for i in common]
            flips = sum(passages[i][1] != base[i][1] for i in common)
            ppl = abs(summary["perplexity"] - base_sum["perplexity"]) / base_sum["perplexity"]
            model, dtype, batch = key
            print(f"| {d} | {model} | {dtype} | {batch} | {what} | {len(common)} "
                  f"| {base_sum['accuracy']:.4f} / {summary['accuracy']:.4f} | {ppl:.1e} "
                  f"| {max(rel):.1e} | {statistics.median(rel):.1e} | {flips} |")

if __name__ == "__main__":
    main(sys.argv[1:] or ["results/h200x2/tp", "results/h200x4/tp"])
