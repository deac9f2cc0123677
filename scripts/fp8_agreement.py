#!/usr/bin/env python3
"""Generated ids of two LAMBADA --mode generate runs (FasterTransformer's bloom_lambada), side by
side: the share of ids identical position by position and of passages generated identically,
and each run's accuracy and (from score runs, if given) perplexity. #37's fp8 check: run A at
--dtype bf16, B at --dtype fp8, from the same checkpoint and passages.

    python3 scripts/fp8_agreement.py LOGS_A LOGS_B [SCORE_A SCORE_B]

Each argument is a log (.jsonl / .jsonl.gz) or a folder searched for them. Standard library only.
"""
import gzip
import json
import pathlib
import sys


def records(arg):
    p = pathlib.Path(arg)
    files = sorted(p.rglob("*.jsonl*")) if p.is_dir() else [p]
    for f in files:
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def generated(arg):
    """Passage index -> generated ids, and the run's dtype."""
    out, dtype = {}, None
    for r in records(arg):
        if r.get("record") == "header":
            dtype = r.get("dtype")
        if r.get("record") == "gen_batch":
            for p in r.get("passages", []):
                out[p["index"]] = (p["generated"], p["correct"])
    return out, dtype


def score_summary(arg):
    for r in records(arg):
        if r.get("record") == "summary":
            return r
    return None


def main(argv):
    if len(argv) not in (3, 5):
        sys.exit("usage: fp8_agreement.py LOGS_A LOGS_B [SCORE_A SCORE_B]")
    (a, da), (b, db) = generated(argv[1]), generated(argv[2])
    common = sorted(set(a) & set(b))
    if not common:
        sys.exit("no passage generated in both runs: give two LAMBADA --mode generate logs")
    same_ids = total_ids = same_passages = 0
    for i in common:
        ga, gb = a[i][0], b[i][0]
        total_ids += max(len(ga), len(gb))
        same_ids += sum(x == y for x, y in zip(ga, gb))
        same_passages += ga == gb
    acc = lambda g: sum(g[i][1] for i in common) / len(common)
    print(f"passages: {len(common)} (A {da}, B {db})")
    print(f"generated ids identical: {same_ids}/{total_ids} = {same_ids / total_ids:.4f}")
    print(f"passages generated identically: {same_passages}/{len(common)} = {same_passages / len(common):.4f}")
    print(f"accuracy (FT generate): A {acc(a):.4f}, B {acc(b):.4f}")
    if len(argv) == 5:
        sa, sb = score_summary(argv[3]), score_summary(argv[4])
        if not (sa and sb):
            sys.exit("no summary record in the score logs")
        pa, pb = sa["perplexity"], sb["perplexity"]
        print(f"held-out perplexity (LAMBADA targets): A {pa:.4f}, B {pb:.4f}, B/A - 1 = {pb / pa - 1:+.5f}")
        print(f"accuracy (scored): A {sa['accuracy']:.4f}, B {sb['accuracy']:.4f}")


if __name__ == "__main__":
    main(sys.argv)
