#!/usr/bin/env python3
"""Candle-vs-HF ratio table (markdown) from run logs of `bench --engine both` / `--engine hf`.

usage: python3 scripts/compare_engines.py results/h100/engines/*.jsonl.gz
Pairs every HF run with the candle run of the same model, dtype, batch size and passage count;
ratios are candle / HF (samples/s > 1 and latency < 1 mean candle is faster).
"""
import gzip
import json
import sys

runs = []
for path in sys.argv[1:]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    h, s = recs[0], recs[-1]
    if s.get("record") == "summary" and s["status"] == "ok":
        runs.append((h, s))

key = lambda h, s: (h["model"]["name"], h["dtype"], h["batch_size"], s["n_samples"])
candle = {key(h, s): s for h, s in runs if h["engine"] == "candle"}
order = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}
rows = []
for h, s in runs:
    if h["engine"] != "hf" or key(h, s) not in candle:
        continue
    c = candle[key(h, s)]
    rows.append((
        h["model"]["name"], h["dtype"], h["batch_size"], s["n_samples"], "hf-" + h["engine_info"].get("attn", "?"),
        f'{c["samples_per_second"]:.1f}', f'{s["samples_per_second"]:.1f}',
        f'{c["samples_per_second"] / s["samples_per_second"]:.2f}',
        f'{c["latency_ms_p50"]:.2f}', f'{s["latency_ms_p50"]:.2f}',
        f'{c["latency_ms_p50"] / s["latency_ms_p50"]:.2f}',
        f'{c["peak_memory_bytes"] / 2**20:.0f}', f'{s["peak_memory_bytes"] / 2**20:.0f}',
        f'{c["peak_memory_bytes"] / s["peak_memory_bytes"]:.2f}',
        f'{abs(c["perplexity"] - s["perplexity"]) / s["perplexity"]:.1e}',
    ))
rows.sort(key=lambda r: (r[0], order[r[1]], -r[2], r[4]))
print("| model | dtype | batch | passages | HF | candle samples/s | HF samples/s | **ratio** | candle p50 ms | HF p50 ms | p50 ratio | candle peak MiB | HF peak MiB | mem ratio | ppl rel. diff |")
print("|" + "---|" * 15)
for r in rows:
    r = list(r)
    r[7] = f"**{r[7]}**"
    print("| " + " | ".join(str(x) for x in r) + " |")
