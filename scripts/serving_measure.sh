#!/usr/bin/env bash
# #39 on one GPU: the serving suite through candle and HF, one binary, one call. Run from the repo
# root on the GPU host (scripts/gpu_checks.sh serving): $B the bench binary, $OUT the folder that
# comes back. For each model of $SERVE_MODELS (gpt2): a smoke run of HF alone (which batching
# its worker chose, and why), then per engine of $SERVE_ENGINES (candle candle-static hf; -static:
# --batching static, else each engine's default, continuous batching; -tpN: candle over --tp N
# ranks, candle-tp2 or candle-static-tp2, one GPU a rank) a rate sweep
# ($SERVE_RATES, default 4,8,16,32,64,inf) of $SERVE_N (64) requests, prompts 64..256 tokens,
# outputs $SERVE_OUT (128), goodput under a 200 ms TTFT / 20 ms TPOT SLO, $SERVE_FLAGS added. Each sweep's logs -> serving-logs.tgz (refreshed after each
# sweep), the console -> serving.txt. A -tpN engine's sweep launches the N ranks of each rate
# (serving-run1 ran one `bench --tp N` a rate instead, before sweeps took --tp).
set -u
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared hosts (KINDS.md)
L=/tmp/serving-logs
mkdir -p $L
say() { tee -a "$OUT/serving.txt"; }
run() { # name bench-args
  local name=$1; shift
  echo "--- $name: $*" | say
  $B --no-progress --log-dir "$L/$name" "$@" 2>&1 | grep -v '^  |' | say
  echo "exit ${PIPESTATUS[0]}" | say
  (cd /tmp && tar czf "$OUT/serving-logs.tgz" serving-logs)
}
LOAD=(--suite serving --weights random --seed 0 --device cuda --dtype bf16 --input-len 64:256
  --slo ttft_ms=200,tpot_ms=20)
for m in ${SERVE_MODELS:-gpt2}; do
  # The smoke run's whole console (the worker's lines too), cut off after $SERVE_SMOKE_S seconds
  # (0: no smoke run).
  if [ "${SERVE_SMOKE_S:-150}" != 0 ]; then
  echo "--- smoke-hf-$m" | say
  timeout "${SERVE_SMOKE_S:-150}" $B --no-progress --log-dir "$L/smoke-hf-$m" "${LOAD[@]}" --model "$m" \
    --engine hf --num-requests 8 --output-len 16 --request-rate 4 2>&1 | say
  echo "exit ${PIPESTATUS[0]}" | say
  grep -ho '"serving_batching":"[^"]*"' "$L/smoke-hf-$m"/*.jsonl 2>/dev/null | head -1 | say
  fi
  for e in ${SERVE_ENGINES:-candle candle-static hf}; do
    # ENGINE[-static][-tpN]: --batching static (else each engine's default, continuous);
    # --tp N (candle only)
    base=${e%-tp*} tp=
    [ "$base" != "$e" ] && tp=${e##*-tp}
    local_flags=(--engine "${base%-static}")
    [ "$base" != "${base%-static}" ] && local_flags+=(--batching static)
    rates=${SERVE_RATES:-4,8,16,32,64,inf}
    [ -n "$tp" ] && local_flags+=(--tp "$tp")
    # shellcheck disable=SC2086  # SERVE_FLAGS: several flags
    run sweep-$m-$e "${LOAD[@]}" --model "$m" "${local_flags[@]}" --num-requests "${SERVE_N:-64}" \
      --output-len "${SERVE_OUT:-128}" --request-rate "$rates" ${SERVE_FLAGS:-}
  done
done
