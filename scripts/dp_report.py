#!/usr/bin/env python3
"""Data-parallel training logs: equivalence and scaling.

    python3 scripts/dp_report.py DIR [DIR ...]

Reads every wikitext2 run log (*.jsonl or *.jsonl.gz) in each DIR (one host and session) and
prints two markdown tables for it, comparing runs within the DIR only:
- equivalence: each dp=N run against the dp=1 run of the same model and dtype whose global
  batch (batch x grad_accum x N) is the same: per-step loss and grad-norm relative
  differences (max over steps);
- scaling: every run with train_samples_per_second, scaling efficiency = throughput(N) /
  (N x throughput(1)) against the dp=1 run of the same model, dtype and per-rank batch
  (batch x grad_accum), communication share and peak memory per rank.
Standard library only.
"""
import gzip
import json
import sys
from pathlib import Path


def read(path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    h = recs[0]
    steps = [r for r in recs if r["record"] == "step"]
    summary = next((r for r in recs if r["record"] == "train_summary"), None)
    dp = h.get("dp") or {}
    n = dp.get("size", 1)
    accum = h["train"]["grad_accum"]
    return {
        "name": path.name, "model": h["model"]["name"], "dtype": h["dtype"], "n": n,
        "zero": dp.get("zero_stage", 0), "batch": h["batch_size"], "accum": accum,
        "global": h["batch_size"] * accum * n, "dropout": h["train"]["dropout"],
        "steps": steps, "summary": summary,
    }


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main(dirs):
    for d in dirs:
        print(f"### {d}\n")
        report([r for r in (read(p) for p in sorted(Path(d).glob("wikitext2_*.jsonl*"))) if r["summary"]])
        print()


def report(runs):
    """Both tables for the runs of one directory (one host, one session)."""
    print("| model | dtype | run | compared with | steps | loss rel. diff max | grad norm rel. diff max |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        if r["n"] == 1:
            continue
        for b in runs:
            same = (b["n"] == 1 and b["model"] == r["model"] and b["dtype"] == r["dtype"]
                    and b["global"] == r["global"] and not b["dropout"] and not r["dropout"])
            if not same:
                continue
            k = min(len(r["steps"]), len(b["steps"]))
            dl = max(rel(r["steps"][i]["loss"], b["steps"][i]["loss"]) for i in range(k))
            dg = max(rel(r["steps"][i]["grad_norm"], b["steps"][i]["grad_norm"]) for i in range(k))
            print(f"| {r['model']} | {r['dtype']} | dp {r['n']} ZeRO-{r['zero']} | dp 1, grad_accum "
                  f"{b['accum']} | {k} | {dl:.1e} | {dg:.1e} |")
    print()
    print("| model | dtype | dp | ZeRO | global batch | train_samples_per_second | scaling efficiency "
          "| all-reduce share | peak GiB by rank | log |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        s = r["summary"]
        base = next((b for b in runs if b["n"] == 1 and b["model"] == r["model"]
                     and b["dtype"] == r["dtype"] and b["batch"] * b["accum"] == r["batch"] * r["accum"]
                     and b["dropout"] == r["dropout"]), None)
        eff = (s["train_samples_per_second"] / (r["n"] * base["summary"]["train_samples_per_second"])
               if base else float("nan"))
        peaks = s.get("per_rank_peak_memory_bytes") or [s["peak_memory_bytes"]]
        share = s.get("comm_share")
        print(f"| {r['model']} | {r['dtype']} | {r['n']} | {r['zero']} | {r['global']} "
              f"| {s['train_samples_per_second']:.2f} | {eff:.3f} "
              f"| {'' if share is None else f'{share * 100:.1f}%'} "
              f"| {' / '.join(f'{p / 2**30:.2f}' for p in peaks)} | {r['name']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
