#!/usr/bin/env bash
# Speed benchmark of extract-metrics and plot over a generated corpus (targets: 10,000 logs in
# < 2 s, one chart in < 1 s, on a 2-core machine). Prints the figures; asserts nothing.
#   bash scripts/bench_extract.sh [N_LOGS]       (default 10000; uses target/release binaries)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
X=target/release/extract-metrics
P=target/release/plot
[ -x $X ] && [ -x $P ] || cargo build --release --quiet --bin extract-metrics --bin plot
C=$(mktemp -d)
trap 'rm -rf "$C"' EXIT
# The corpus: the committed sample logs of every format, copied round-robin to N files.
mapfile -t SRC < <(ls tests/fixtures/logs/bench/*.jsonl tests/fixtures/logs/llmc/*.log tests/fixtures/logs/hf_trainer/run_clm.log)
for i in $(seq 0 $((N - 1))); do
  s=${SRC[$((i % ${#SRC[@]}))]}
  d=$C/run$((i / 500))
  mkdir -p "$d"
  cp "$s" "$d/$i-$(basename "$s")"
done
bytes=$(du -sb "$C" | cut -f1)
t() { local s e; s=$(date +%s.%N); "$@" > /dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
for rep in 1 2 3; do
  echo "extract: $(t $X -i "$C" -o "$C.csv") s for $N logs ($((bytes / 1024 / 1024)) MiB)"
done
for rep in 1 2 3; do
  echo "plot:    $(t $P -i "$C.csv" -o "$C.png" --metric samples_per_second --x model) s ($(wc -l < "$C.csv") CSV rows)"
done
rm -f "$C.csv" "$C.png"
