#!/usr/bin/env bash
# #40 item 3: candle against HF's best (the probe: attention x torch.compile, every candidate
# timed, the fastest kept), bf16, on one GPU; each argument one run of `--engine both`:
#   gen:MODEL:BATCH      generation suite, prompt 128 + 128, $PROBE_CALLS (5) prompts
#   score:MODEL          LAMBADA scoring, batch 16, full set
#   ft:MODEL             LAMBADA --mode generate (FasterTransformer's), batch 16, first $GEN_LIMIT (640)
# $PAD sets --pad-multiple (HF's compiled candidates then see one shape a bucket).
# Logs -> $OUT/remeasure-logs.tgz after every run, console -> $OUT/remeasure.txt.
# Needs .gpu/bench.xz (the CUDA bench) and .gpu/lambada_test.jsonl.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=/tmp/remeasure; mkdir -p "$OUT" "$L"
B=/tmp/bench
[ -x $B ] || { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/bench.xz $B && chmod +x $B; }
R=(--engine both --weights random --seed 0 --device cuda --dtype bf16 --no-progress ${PAD:+--pad-multiple $PAD})
for job in "$@"; do
  IFS=: read -r kind model bs <<< "$job"
  name=$kind-$model${bs:+-bs$bs}${PAD:+-pad$PAD}
  mkdir -p "$L/$name"
  case $kind in
  gen) args=(--suite generation --prompt-lens 128 --new-tokens 128 --limit "${PROBE_CALLS:-5}" --batch-size "$bs") ;;
  score) args=(--suite lambada --data .gpu/lambada_test.jsonl --batch-size 16) ;;
  ft) args=(--suite lambada --mode generate --data .gpu/lambada_test.jsonl --batch-size 16 --limit "${GEN_LIMIT:-640}") ;;
  *) echo "unknown job $job" >&2; exit 2 ;;
  esac
  echo "--- $name" | tee -a "$OUT/remeasure.txt"
  $B "${R[@]}" --model "$model" "${args[@]}" --log-dir "$L/$name" 2>&1 \
    | grep -v '^  |' | tee -a "$OUT/remeasure.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/remeasure.txt"
  (cd /tmp && tar czf "$OUT/remeasure-logs.tgz" remeasure)
done
