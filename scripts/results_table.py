#!/usr/bin/env python3
"""Markdown table of run logs (summary records), for results/README.md.

usage: python3 scripts/results_table.py results/h100/*.jsonl.gz
Tables in results/ are made from the logs, never typed by hand.
"""
import gzip
import json
import sys

rows = []
for path in sys.argv[1:]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    h, s = recs[0], recs[-1]
    if s.get("record") != "summary":
        continue
    gpu = h["host"]["gpus"][0]["name"] if h["host"]["gpus"] else h["host"]["cpu"]
    rows.append((
        h["model"]["name"], h["dtype"], h["batch_size"], s["n_samples"],
        f'{s["samples_per_second"]:.1f}', f'{s["tokens_per_second"]:.0f}',
        f'{s["latency_ms_p50"]:.2f}', f'{s["latency_ms_p99"]:.2f}',
        f'{s["peak_memory_bytes"] / 2**30:.2f}', f'{(s.get("peak_host_memory_bytes") or 0) / 2**30:.2f}',
        f'{h["load_seconds"]:.2f}', f'{s["accuracy"]:.4f}', f'{s["perplexity"]:.4g}',
        gpu, h["host"]["driver_version"], h["git_commit"], path.split("/")[-1],
    ))
print("| model | dtype | batch | passages | samples/s | tokens/s | p50 ms | p99 ms | peak GPU GiB | peak host GiB | load s | acc | ppl | GPU | driver | commit | log |")
print("|" + "---|" * 17)
for r in sorted(rows, key=lambda r: (r[0], ["fp32", "tf32", "bf16", "fp16"].index(r[1]))):
    print("| " + " | ".join(str(x) for x in r) + " |")
