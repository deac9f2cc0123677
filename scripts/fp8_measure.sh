#!/usr/bin/env bash
# #37 item 3: fp8 weights (`--dtype fp8`) against bf16 on one GPU, one binary, one call. Run from
# the repo root on the GPU host (scripts/gpu_checks.sh fp8): $B the bench binary, $OUT the folder
# that comes back, .gpu/wikitext-2-raw and .gpu/lambada_test.jsonl unpacked.
#  1. accuracy, where it means something (random weights have near-flat logits): gpt2 124M
#     trained here from random weights on WikiText-2 (wiki.valid.raw; its eval on wiki.test.raw)
#     in bf16 for $FP8_EPOCHS epochs and saved (--save); then from that checkpoint, at --dtype
#     bf16 and fp8: LAMBADA scored (all 5153 passages: held-out perplexity and accuracy) and
#     generated (FasterTransformer's mode, batch 16, and batch 1 on the first $FP8_GEN1_LIMIT
#     passages, where the fp8 GEMV runs); scripts/fp8_agreement.py compares the
#     generated ids and the perplexities                                   -> fp8.txt
#  2. speed: the generation suite (prompt 128 + 128, $FP8_CALLS calls) at $FP8_BATCHES (1 16), bf16
#     then fp8 ($FP8_DTYPES), for $FP8_MODELS (random weights); $FP8_VARIANTS / $FP8_ROUNDS: flag
#     sets run after each default run, and rounds of it all (an A/B in one call) -> fp8.txt
# Every log in -> fp8-logs.tgz (refreshed after each run: a time-out keeps what finished).
set -u
: "${B:?the bench binary: run this through scripts/gpu_checks.sh fp8}"
L=/tmp/fp8-logs CK=/tmp/fp8-ckpt
mkdir -p $L
say() { tee -a "$OUT/fp8.txt"; }
run() { # name bench-args: one run, its log under $L/name
  local name=$1; shift
  echo "--- $name: $*" | say
  $B --no-progress --log-dir "$L/$name" "$@" 2>&1 | grep -v '^  |' | say
  echo "exit ${PIPESTATUS[0]}" | say
  (cd /tmp && tar czf "$OUT/fp8-logs.tgz" fp8-logs)
}
for part in ${FP8_PARTS:-accuracy speed}; do
  case $part in
  accuracy)
    run train --suite wikitext2 --model gpt2 --weights random --seed 0 --device cuda --dtype bf16 \
      --data .gpu/wikitext-2-raw --batch-size 8 --block-size 1024 --epochs "${FP8_EPOCHS:-10}" \
      --lr "${FP8_LR:-3e-4}" --no-dropout --save $CK
    for dt in bf16 fp8; do
      run score-$dt --suite lambada --model-dir $CK --device cuda --dtype $dt --batch-size 16 \
        --data .gpu/lambada_test.jsonl
      run gen-$dt --suite lambada --mode generate --model-dir $CK --device cuda --dtype $dt \
        --batch-size 16 --data .gpu/lambada_test.jsonl
      # Batch 1: the decode GEMV reads the fp8 bytes (batch 16 multiplies the dequantized weights).
      run gen1-$dt --suite lambada --mode generate --model-dir $CK --device cuda --dtype $dt \
        --batch-size 1 --data .gpu/lambada_test.jsonl --limit "${FP8_GEN1_LIMIT:-1000}"
    done
    python3 scripts/fp8_agreement.py $L/gen-bf16 $L/gen-fp8 $L/score-bf16 $L/score-fp8 2>&1 | say
    python3 scripts/fp8_agreement.py $L/gen1-bf16 $L/gen1-fp8 2>&1 | say
    ;;
  speed)
    # $FP8_VARIANTS: ";"-separated flag sets, each run after the default one (the same binary's
    # A/B, e.g. a --fused list without one path); $FP8_ROUNDS (1) rounds of it all.
    IFS=';' read -ra variants <<< "${FP8_VARIANTS:-}"
    for r in $(seq "${FP8_ROUNDS:-1}"); do
      for m in ${FP8_MODELS:-gpt2 bloom-560m bloom-7b1}; do
        for bs in ${FP8_BATCHES:-1 16}; do
          for dt in ${FP8_DTYPES:-bf16 fp8}; do
            G=(--suite generation --model "$m" --weights random --seed 0 --device cuda --dtype $dt
               --batch-size $bs --prompt-lens 128 --new-tokens 128 --limit "${FP8_CALLS:-10}")
            run dec-$m-bs$bs-$dt-r$r "${G[@]}"
            for i in "${!variants[@]}"; do
              v=${variants[$i]}
              [ -n "$v" ] || continue
              # The variant's index first: two --fused lists may share their first 40 characters.
              tag=v$i-$(echo "$v" | tr -c 'a-zA-Z0-9=\n' '-' | sed 's/^-*//' | cut -c1-40)
              # shellcheck disable=SC2086  # a variant is several flags
              run dec-$m-bs$bs-$dt-r$r-$tag "${G[@]}" $v
            done
          done
        done
      done
    done
    ;;
  esac
done
