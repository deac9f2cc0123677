#!/usr/bin/env python3
"""Do two bench runs compute the same thing? Reads two run logs (JSONL, or .jsonl.gz) and
compares what a parallel layout must not change; exits 1 with the first difference.

  compare_runs.py scores A B [--spread C] [--floor 1e-6]
      LAMBADA scoring: per-passage log-likelihoods of B within the spread of A against C (the
      same engine at another batch size: how far numbers move when only the kernels' shapes
      change), at least --floor relative; greedy flags equal.
  compare_runs.py ids A B
      LAMBADA --mode generate: every passage's generated ids identical.
  compare_runs.py losses A B [--rtol 1e-4]
      Training: every step's loss within rtol (data parallel against accumulation, ZeRO
      stages against plain data parallelism).

Used by scripts/gpu_checks.sh multi-smoke; the logs are what `bench` writes (src/record.rs).
"""
import argparse
import gzip
import json
import sys


def records(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def scored(path):
    """{passage index: (ll, greedy)} of a scoring log."""
    out = {}
    for r in records(path):
        if r.get("record") == "batch":
            for p in r["passages"]:
                out[p["index"]] = (p["ll"], p["greedy"])
    if not out:
        sys.exit(f"{path}: no scored passages (not a LAMBADA scoring log?)")
    return out


def generated(path):
    """{passage index: ids} of a `--mode generate` log."""
    out = {}
    for r in records(path):
        for p in r.get("passages", []) if r.get("record") == "gen_batch" else []:
            out[p["index"]] = p["generated"]
    if not out:
        sys.exit(f"{path}: no generated passages (not a --mode generate log?)")
    return out


def losses(path):
    out = [r["loss"] for r in records(path) if r.get("record") == "step"]
    if not out:
        sys.exit(f"{path}: no training steps")
    return out


def common(a, b, what):
    keys = sorted(set(a) & set(b))
    if not keys:
        sys.exit(f"{what}: the two runs share no passage")
    return keys


def compare_scores(args):
    a, b = scored(args.a), scored(args.b)
    keys = common(a, b, "scores")
    spread = 0.0
    if args.spread:
        c = scored(args.spread)
        spread = max(abs(a[k][0] - c[k][0]) for k in common(a, c, "spread"))
    worst, at = 0.0, None
    for k in keys:
        (ll_a, g_a), (ll_b, g_b) = a[k], b[k]
        tol = max(spread, args.floor * abs(ll_a))
        d = abs(ll_a - ll_b)
        if d > tol:
            sys.exit(f"FAIL scores: passage {k}: ll {ll_b} vs {ll_a} (|d| {d:.3g} > {tol:.3g})")
        if g_a != g_b:
            sys.exit(f"FAIL scores: passage {k}: greedy {g_b} vs {g_a}")
        if d >= worst:
            worst, at = d, k
    print(f"ok scores: {len(keys)} passages, max |dll| {worst:.3g} (passage {at}), "
          f"batch-size spread {spread:.3g}, greedy flags equal")


def compare_ids(args):
    a, b = generated(args.a), generated(args.b)
    keys = common(a, b, "ids")
    for k in keys:
        if a[k] != b[k]:
            sys.exit(f"FAIL ids: passage {k}: {b[k]} vs {a[k]}")
    print(f"ok ids: {len(keys)} passages, generated ids identical")


def compare_losses(args):
    a, b = losses(args.a), losses(args.b)
    if len(a) != len(b):
        sys.exit(f"FAIL losses: {len(b)} steps vs {len(a)}")
    worst = 0.0
    for i, (x, y) in enumerate(zip(a, b)):
        r = abs(x - y) / max(abs(x), 1e-12)
        if r > args.rtol:
            sys.exit(f"FAIL losses: step {i}: {y} vs {x} (rel {r:.3g} > {args.rtol})")
        worst = max(worst, r)
    print(f"ok losses: {len(a)} steps, max rel diff {worst:.3g}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scores")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--spread", help="A's engine at another batch size")
    s.add_argument("--floor", type=float, default=1e-6, help="least relative tolerance")
    s.set_defaults(run=compare_scores)
    i = sub.add_parser("ids")
    i.add_argument("a")
    i.add_argument("b")
    i.set_defaults(run=compare_ids)
    l = sub.add_parser("losses")
    l.add_argument("a")
    l.add_argument("b")
    l.add_argument("--rtol", type=float, default=1e-4)
    l.set_defaults(run=compare_losses)
    args = p.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
