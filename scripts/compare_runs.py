#!/usr/bin/env python3
"""Do two bench runs compute the same thing? Reads two run logs (JSONL, or .jsonl.gz) and
compares what a parallel layout must not change; exits 1 with the first difference.

  compare_runs.py scores A B [--spread C] [--floor 1e-6]
      LAMBADA scoring: |ll(B) - ll(A)| per passage within the spread of A against C (the same
      engine at another batch size: how far numbers move when only the kernels' shapes change):
      its p50, p90 and p99 at most --slack times the spread's, its largest at most twice the
      spread's (never below --floor); greedy flags equal (all passages of A and B).
  compare_runs.py ids A B [--min-share 1]
      LAMBADA --mode generate: the share of passages whose generated ids are identical, at
      least --min-share (all of them by default).
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
    try:
        with opener(path, "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"{path or '(no path)'}: not a readable run log ({e})")


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


def quantiles(xs):
    """p50, p90, p99 and the largest of xs."""
    xs = sorted(xs)
    n = len(xs)
    return [xs[min(n - 1, int(n * q))] for q in (0.5, 0.9, 0.99)] + [xs[-1]]


def compare_scores(args):
    a, b = scored(args.a), scored(args.b)
    keys = common(a, b, "scores")
    for k in keys:
        if a[k][1] != b[k][1]:
            sys.exit(f"FAIL scores: passage {k}: greedy {b[k][1]} vs {a[k][1]}")
    spread = [0.0] * 4
    if args.spread is not None:  # over the passages all three runs scored
        c = scored(args.spread)
        keys = [k for k in keys if k in c]
        if not keys:
            sys.exit("scores: the spread run shares no passage with the other two")
        spread = quantiles([abs(a[k][0] - c[k][0]) for k in keys])
    diff = quantiles([abs(a[k][0] - b[k][0]) for k in keys])
    floor = args.floor * max(abs(a[k][0]) for k in keys)
    # Within the spread: each of p50, p90, p99 at most `slack` times the spread's, the largest
    # at most twice the spread's largest (one passage decides a maximum).
    limits = [max(s * f, floor) for s, f in zip(spread, [args.slack] * 3 + [2.0])]
    names = ["p50", "p90", "p99", "max"]
    said = ", ".join(f"{n} {d:.3g} (spread {s:.3g})" for n, d, s in zip(names, diff, spread))
    for n, d, lim in zip(names, diff, limits):
        if d > lim:
            sys.exit(f"FAIL scores: |dll| {n} {d:.3g} > {lim:.3g}: {said}")
    print(f"ok scores: {len(keys)} passages, |dll| {said}; greedy flags equal")


def compare_ids(args):
    a, b = generated(args.a), generated(args.b)
    keys = common(a, b, "ids")
    same = [k for k in keys if a[k] == b[k]]
    share = len(same) / len(keys)
    if share < args.min_share:
        first = next(k for k in keys if a[k] != b[k])
        sys.exit(f"FAIL ids: identical for {len(same)} of {len(keys)} passages "
                 f"(first difference: passage {first}: {b[first]} vs {a[first]})")
    print(f"ok ids: identical for {len(same)} of {len(keys)} passages ({100 * share:.1f} %)")


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
    s.add_argument("--floor", type=float, default=1e-6,
                   help="least tolerance, relative to the largest |ll|")
    s.add_argument("--slack", type=float, default=1.25,
                   help="how far each quantile of |dll| may exceed the spread's")
    s.set_defaults(run=compare_scores)
    i = sub.add_parser("ids")
    i.add_argument("a")
    i.add_argument("b")
    i.add_argument("--min-share", type=float, default=1.0,
                   help="least share of passages with identical ids (1: all; half precision "
                        "moves near-ties, so its runs report the share with 0)")
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
