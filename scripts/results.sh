#!/usr/bin/env bash
# Regenerates results/*.csv and results/*.png from the committed run logs.
#   bash scripts/results.sh        (builds the release binaries first if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin extract-metrics --bin plot
X=target/release/extract-metrics
P=target/release/plot
R=results

# Every H100 log into one CSV; the candle-vs-HF pairs (one commit, one session) into another.
$X -i "$R/h100/*.jsonl.gz" "$R/h100/engines/*.jsonl.gz" -o $R/h100.csv
$X -i "$R/h100/engines/*.jsonl.gz" -o $R/h100_engines.csv
# candle vs HF, throughput at batch 16 and batch 1, half precision, by model.
$P -i $R/h100_engines.csv -o $R/h100_samples_per_second_bs16.png --metric samples_per_second \
   --x model --batch-size 16 --bf16 --fp16 --title "LAMBADA samples/s, batch 16, H100 (candle vs HF)"
$P -i $R/h100_engines.csv -o $R/h100_samples_per_second_bs1.png --metric samples_per_second \
   --x model --batch-size 1 --bf16 --fp16 --title "LAMBADA samples/s, batch 1, H100 (candle vs HF)"
# Peak GPU memory by model and engine, bf16, batch 16.
$P -i $R/h100_engines.csv -o $R/h100_peak_memory_bs16.png --metric peak_memory_bytes \
   --x model --batch-size 16 --bf16 --title "Peak GPU memory, LAMBADA bf16 batch 16, H100"
echo "wrote $R/h100.csv, $R/h100_engines.csv and $R/h100_*.png"

# Tensor parallelism on H200s: every run into one CSV; charts from the one 4x run with the fixed binary.
$X -i "$R/h200x2/tp/*.jsonl.gz" "$R/h200x4/tp/*.jsonl.gz" "$R/h200x4/tp-run2/*.jsonl.gz" -o $R/h200_tp.csv
$X -i "$R/h200x4/tp-run2/*.jsonl.gz" -o /tmp/h200x4_tp_run2.csv
for m in bloom-7b1 gpt2-xl; do
  $P -i /tmp/h200x4_tp_run2.csv -o $R/h200x4_tp_${m}_bs16.png --metric samples_per_second --x tp \
     --model $m --batch-size 16 --bf16 --title "LAMBADA $m bf16 batch 16, 4x H200: samples/s by tensor-parallel degree"
  $P -i /tmp/h200x4_tp_run2.csv -o $R/h200x4_tp_${m}_bs16_memory.png --metric peak_memory_bytes --x tp \
     --model $m --batch-size 16 --bf16 --title "LAMBADA $m bf16 batch 16, 4x H200: peak memory of rank 0"
done
python3 scripts/tp_agreement.py $R/h200x2/tp $R/h200x4/tp-run2

# Data-parallel fine-tuning on H200s: every run into one CSV; the chart from the 4x host's runs.
$X -i "$R/h200x2/dp/*.jsonl.gz" "$R/h200x4/dp/*.jsonl.gz" -o $R/h200_dp.csv
$X -i "$R/h200x4/dp/*.jsonl.gz" -o /tmp/h200x4_dp.csv
$P -i /tmp/h200x4_dp.csv -o $R/h200x4_dp_gpt2_bf16.png --metric train_samples_per_second --x dp \
   --model gpt2 --bf16 --title "gpt2 bf16 fine-tuning, 8 blocks per GPU, 4x H200 (whiskers: ZeRO-0 vs 1)"
python3 scripts/dp_report.py $R/h200x2/dp $R/h200x4/dp

# Data-parallel, 200 timed steps, 4x H200: gpt2 (batch 8 per GPU) and gpt2-medium (batch 4).
$X -i "$R/h200x4/dp-200/*.jsonl.gz" -o $R/h200x4_dp200.csv
for m in gpt2 gpt2-medium; do
  $P -i $R/h200x4_dp200.csv -o $R/h200x4_dp200_${m}_bf16.png --metric train_samples_per_second --x dp \
     --model $m --bf16 --title "$m bf16 fine-tuning, 4x H200, 200 steps: samples/s by dp (whiskers: ZeRO-0 vs 1)"
done
python3 scripts/dp_report.py $R/h200x4/dp-200

# Fused kernels, second round (training), H100: before (7f8523b) and after (0174acc).
$X -i "$R/h100/perf/train-round2/*/*.jsonl.gz" -o $R/h100_perf_train_round2.csv
$X -i "$R/h100/perf/final/*.jsonl.gz" -o $R/h100_perf_final.csv
