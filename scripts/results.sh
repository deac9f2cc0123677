#!/usr/bin/env bash
# Regenerates results/*.csv, results/*.png and the tables of results/HISTORY.md (the diary; the
# page of current figures, results/README.md, is scripts/results_page.sh's) from the
# committed run logs, with the release binaries only (extract-metrics, plot).
#   bash scripts/results.sh        (builds the release binaries first if needed)
# Each generated table sits in results/HISTORY.md between `<!-- table NAME -->` and
# `<!-- /table -->`; `git diff results/` shows what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin extract-metrics --bin plot
X=target/release/extract-metrics
P=target/release/plot
R=results
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# table NAME EXTRACT-METRICS-ARGS…: the Markdown table into results/HISTORY.md between its
# markers (indented as the opening marker is, so a table can sit in a list item).
table() {
  local name=$1
  shift
  $X "$@" -o "$T/$name.md"
  grep -q "^ *<!-- table $name -->$" $R/HISTORY.md || { echo "no <!-- table $name --> in $R/HISTORY.md" >&2; exit 1; }
  awk -v start="<!-- table $name -->" -v file="$T/$name.md" '
    { line = $0; sub(/^ +/, "", line); indent = substr($0, 1, length($0) - length(line)) }
    line == start { print; while ((getline l < file) > 0) print (l == "" ? "" : indent l); skip = 1; next }
    skip && line == "<!-- /table -->" { skip = 0 }
    !skip { print }' $R/HISTORY.md > "$T/HISTORY.md"
  cp "$T/HISTORY.md" $R/HISTORY.md
}

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
$X -i "$R/h200x4/tp-run2/*.jsonl.gz" -o "$T/h200x4_tp_run2.csv"
for m in bloom-7b1 gpt2-xl; do
  $P -i "$T/h200x4_tp_run2.csv" -o $R/h200x4_tp_${m}_bs16.png --metric samples_per_second --x tp \
     --model $m --batch-size 16 --bf16 --title "LAMBADA $m bf16 batch 16, 4x H200: samples/s by tensor-parallel degree"
  $P -i "$T/h200x4_tp_run2.csv" -o $R/h200x4_tp_${m}_bs16_memory.png --metric peak_memory_bytes --x tp \
     --model $m --batch-size 16 --bf16 --title "LAMBADA $m bf16 batch 16, 4x H200: peak memory of rank 0"
done

# Data-parallel fine-tuning on H200s: every run into one CSV; the chart from the 4x host's runs.
$X -i "$R/h200x2/dp/*.jsonl.gz" "$R/h200x4/dp/*.jsonl.gz" -o $R/h200_dp.csv
$X -i "$R/h200x4/dp/*.jsonl.gz" -o "$T/h200x4_dp.csv"
$P -i "$T/h200x4_dp.csv" -o $R/h200x4_dp_gpt2_bf16.png --metric train_samples_per_second --x dp \
   --model gpt2 --bf16 --title "gpt2 bf16 fine-tuning, 8 blocks per GPU, 4x H200: samples/s by dp, ZeRO-0 and -1"

# Data-parallel, 200 timed steps, 4x H200: gpt2 (batch 8 per GPU) and gpt2-medium (batch 4).
$X -i "$R/h200x4/dp-200/*.jsonl.gz" -o $R/h200x4_dp200.csv
for m in gpt2 gpt2-medium; do
  $P -i $R/h200x4_dp200.csv -o $R/h200x4_dp200_${m}_bf16.png --metric train_samples_per_second --x dp \
     --model $m --bf16 --title "$m bf16 fine-tuning, 4x H200, 200 steps: samples/s by dp, ZeRO-0 and -1"
done

# Fused kernels, second round (training), H100: before (7f8523b) and after (0174acc).
$X -i "$R/h100/perf/train-round2/*/*.jsonl.gz" -o $R/h100_perf_train_round2.csv
$X -i "$R/h100/perf/final/*.jsonl.gz" -o $R/h100_perf_final.csv

# Training runs, sweeps (repeats; bloom-7b1 batch sizes) into CSVs. (h100_perf.csv, whose
# engine column was renamed by hand to candle-fused / candle-unfused, is not made here.)
$X -i "$R/h100/train/*.jsonl.gz" -o $R/h100_train.csv
$X -i "$R/h100/train-2026-11-22/*.jsonl.gz" -o $R/h100_train_2026-11-22.csv
$X -i $R/h100/sweeps/sweep_20261121T233609Z -o $R/h100_gpt2_repeat.csv
$X -i $R/h200/sweeps/sweep_20261121T222702Z -o $R/h200_gpt2_repeat.csv
$X -i $R/h100/sweeps/sweep_20261121T233648Z -o $R/h100_bloom7b1_batch_sweep.csv
$X -i $R/h200/sweeps/sweep_20261121T222734Z -o $R/h200_bloom7b1_batch_sweep.csv

# The tables of results/HISTORY.md.
TRAIN_COLS="engine,dtype,train_samples_per_second:.2=train_samples_per_second,step_latency_ms_p50:.1=step p50 ms,train_loss_first:.3,train_loss_last:.3,train_loss:.4,eval_loss:.4,perplexity:.1,peak_memory_bytes:GB.1=peak GB,status"
table perf-final -i "$R/h100/perf/final/*.jsonl.gz" --where dtype=bf16 --ratio candle/hf
table train-round2 -i "$R/h100/perf/train-round2/*/*.jsonl.gz" --where suite=wikitext2 --sort git_commit,engine \
  --columns "engine,git_commit,run,train_samples_per_second:.2,phases_ms_p50_forward:.1=forward p50 ms,phases_ms_p50_backward:.1=backward p50 ms,phases_ms_p50_update:.1=update p50 ms,peak_memory_bytes:GB.1=peak GB"
table dp200-h200x4 -i $R/h200x4/dp-200 --table dp-report
table dp200-h200x2 -i $R/h200x2/dp-200 --table dp-report
table dp -i $R/h200x2/dp $R/h200x4/dp --table dp-report
table tp-scaling -i $R/h200x4/tp-run2 --table tp-scaling
table tp-batch1 -i $R/h200x2/tp $R/h200x4/tp --where batch_size=1 --table tp-scaling
table tp-agreement -i $R/h200x2/tp $R/h200x4/tp-run2 --table tp-agreement
table train-2026-11-22 -i "$R/h100/train-2026-11-22/wikitext2_*.jsonl.gz" --sort dtype,engine --columns "$TRAIN_COLS"
table train-2026-11-21 -i "$R/h100/train/wikitext2_*.jsonl.gz" --sort dtype,engine --columns "$TRAIN_COLS"
table h100-lambada -i "$R/h100/*.jsonl.gz" --where suite=lambada --sort model,dtype \
  --columns "model,dtype,batch_size=batch,n_samples=passages,samples_per_second:.1=samples/s,tokens_per_second:.0=tokens/s,latency_ms_p50:.2=p50 ms,latency_ms_p99:.2=p99 ms,peak_memory_bytes:GiB.2=peak GPU GiB,peak_host_memory_bytes:GiB.2=peak host GiB,load_seconds:.2=load s,accuracy:.4=acc,perplexity:e3=ppl,gpu=GPU,driver,git_commit=commit,run=log"
# 2x H100 (#34, #40): tensor and data parallelism, strategies, HF's probe.
H=$R/h100x2
table tp-h100x2 -i "$H/multi-run1/score-*.jsonl.gz" --table tp-scaling
table tp-agreement-h100x2 -i "$H/multi-run1/score-*.jsonl.gz" --table tp-agreement
table dp-h100x2 -i "$H/multi-run2/dp*.jsonl.gz" "$H/multi-run3/dp*.jsonl.gz" --table dp-report
STRAT_DIRS=("$H/multi-run2/strategies-gpt2-xl-candle" "$H/multi-run3/strategies-gpt2-xl-hf-dp"
  "$H/multi-run3/strategies-gpt2-xl-hf-zero3-rc" "$H/multi-run4/strategies-gpt2-candle")
table strategies-h100x2 -i "${STRAT_DIRS[@]}" --where suite=shakespeare --sort model,engine,zero,recompute,batch_size \
  --columns "model,engine,strategy,recompute,batch_size=batch,train_samples_per_second:.1=samples/s,tokens_per_second:.0=tokens/s,peak_memory_bytes:GiB.1=peak GiB,status,git_commit=commit"
table hf-probe-h100x2 -i "$H/hf-probe-run1/*.jsonl.gz" "$H/hf-probe-run2/*.jsonl.gz" --sort git_commit,batch_size,engine,attn_requested \
  --columns "git_commit=commit,batch_size=batch,engine,attn,attn_requested,hf_compile,decode_tokens_per_second:.1=decode tokens/s,itl_ms_p50:.3=ITL p50 ms,compiles_timed,run=log"
G=$R/h200x2
table tp-decode-h200x2 -i "$G/multi-run1/multi-logs.tgz" "$G/multi-run3/multi-logs.tgz" --where suite=generation \
  --sort git_commit,batch_size,tp,fused \
  --columns "git_commit=commit,batch_size=batch,tp,fused,itl_ms_p50:.3=ITL p50 ms,decode_tokens_per_second:.0=decode tokens/s"
table compare-h200x2 -i "$G/multi-run4/multi-logs.tgz" --compare "$G/multi-run3/multi-logs.tgz"
M=$R/h100
table remeasure-h100 -i "$M/remeasure-run1/hf-probe-logs.tgz" "$M/remeasure-run2/remeasure-logs.tgz" \
  "$M/remeasure-run3/remeasure-logs.tgz" --sort git_commit,suite,mode,model,batch_size,engine,attn_requested \
  --columns "git_commit=commit,suite,mode,model,batch_size=batch,engine,attn,attn_requested=asked,hf_compile=compiled,samples_per_second:.1=samples/s,decode_tokens_per_second:.1=decode tokens/s,compiles_timed"
echo "wrote the tables of $R/HISTORY.md (git diff $R/HISTORY.md shows what changed)"

# Generation (#20): every H100 generation log into one CSV; decode tokens/s of the suite's runs.
$X -i "$R/h100/generate-run*/gen-logs/*.jsonl.gz" -o $R/h100_generate.csv
$P -i $R/h100_generate.csv -o $R/h100_generate_decode_tokens.png --metric decode_tokens_per_second \
   --x batch_size --where gen_source=text --bf16 \
   --title "Generation suite, prompt 128 + 128 new tokens, H100 bf16: decode tokens/s"

# 2x H100 (#34, #40): CSVs and charts.
$X -i "$H/multi-run1/*.jsonl.gz" -o $R/h100x2_tp.csv --columns run,engine,model,dtype,mode,gen_source,batch_size,tp,samples_per_second,tokens_per_second,itl_ms_p50,ttft_ms_p50,peak_memory_bytes,accuracy,status,gpu,git_commit
$X -i "$H/multi-run1/score-*.jsonl.gz" -o "$T/tp-score.csv"
$P -i "$T/tp-score.csv" -o $R/h100x2_tp_bloom-7b1.png --metric samples_per_second --x tp \
   --title "bloom-7b1 bf16 LAMBADA scoring on 2x H100 (bs16: all 5153; bs1: first 500): samples/s by --tp"
$X -i "$H/multi-run2/*.jsonl.gz" "$H/multi-run3/*.jsonl.gz" -o $R/h100x2_dp.csv \
   --columns run,model,dtype,batch_size,dp,zero,tokens_per_second,train_samples_per_second,comm_share,step_latency_ms_p50,peak_memory_bytes,status,gpu,git_commit,time_utc
$X -i "${STRAT_DIRS[@]}" --where suite=shakespeare -o $R/h100x2_strategies.csv \
   --columns model,engine,strategy,zero,recompute,batch_size,train_samples_per_second,tokens_per_second,peak_memory_bytes,peak_memory_share,status,gpu,git_commit
$P -i $R/h100x2_strategies.csv -o $R/h100x2_strategies_gpt2-xl.png --metric tokens_per_second --x batch_size \
   --model gpt2-xl --title "gpt2-xl bf16, Tiny Shakespeare, --dp 2 on 2x H100: tokens/s by batch (OOM: no point)"
$X -i "$H/hf-probe-run1/*.jsonl.gz" "$H/hf-probe-run2/*.jsonl.gz" -o $R/h100x2_hf_probe.csv \
   --columns run,engine,attn,attn_requested,hf_compile,batch_size,decode_tokens_per_second,itl_ms_p50,ttft_ms_p50,compiles_timed,peak_memory_bytes,gpu,git_commit,time_utc
echo "wrote $R/h100x2_*.csv and $R/h100x2_*.png"

# 2x H200 tensor-parallel decoding and the H100 re-measure against HF's best (#34, #40).
$X -i "$G/multi-run1/multi-logs.tgz" "$G/multi-run3/multi-logs.tgz" -o $R/h200x2_tp_decode.csv \
   --columns run,suite,mode,model,dtype,batch_size,tp,fused,samples_per_second,itl_ms_p50,decode_tokens_per_second,peak_memory_bytes,status,gpu,git_commit,time_utc
$X -i "$M/remeasure-run1/hf-probe-logs.tgz" "$M/remeasure-run2/remeasure-logs.tgz" "$M/remeasure-run3/remeasure-logs.tgz" \
   -o $R/h100_remeasure.csv --columns run,suite,mode,model,dtype,batch_size,engine,attn,attn_requested,hf_compile,samples_per_second,decode_tokens_per_second,itl_ms_p50,compiles_timed,peak_memory_bytes,gpu,git_commit,time_utc
echo "wrote $R/h200x2_tp_decode.csv and $R/h100_remeasure.csv"
