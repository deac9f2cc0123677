#!/usr/bin/env bash
# Two-GPU measurements (#34), one stage per argument; run after `gpu_checks.sh multi-smoke`
# passed in the same call. Needs $B (the CUDA + NCCL bench), $OUT, .gpu/lambada_test.jsonl,
# .gpu/wikitext-2-raw, .gpu/input.txt (Tiny Shakespeare). Each run's log lands alone in
# /tmp/multi/NAME/ (all of them -> $OUT/multi-logs.tgz after every run, so a time-out keeps
# what finished); the console goes to $OUT/multi.txt.
#   tp          bloom-7b1 bf16: the design card's command as typed; full LAMBADA batch 16 and
#               the first $B1_LIMIT (500) passages at batch 1, --tp 1 and 2 (tp 2's scores
#               against tp 1's within the batch-size spread); --mode generate batch 16 (first
#               $GEN_LIMIT (320) passages); the generation suite, prompt 128 + 128, batch 1 and 16
#   tp-decode   one sum's time in a CUDA graph (NCCL, one-shot); bloom-7b1 bf16 generation suite, prompt 128 + 128, batch 1 and 16, $TPD_ROUNDS (2)
#               rounds alternating the variants of $TPD_VARIANTS (default "tp1 tp2 nosumnorm"):
#               tp1, tp2 (every fused path), nosumnorm (tp 2, the sum and the add + norm apart),
#               nopush (tp 2, the GEMV writing its output and the sum + norm pushing it),
#               nooneshot (NCCL's all-reduce), nosplithead (the whole head on every rank),
#               neither (NCCL and the whole head)
#   dp          gpt2 bf16 8 x 1024 a rank on WikiText-2 (--drop-last: full batches only; DP_DROP_LAST=0
#               keeps each epoch's partial batch), $DP_STEPS (50) timed steps: dp 1 and
#               dp 2, dropout off and on, then dp 2 with each flag set of $DP_VARIANTS
#               (";"-separated, e.g. "--dp-overlap"); with $DP_TAG set (e.g. a run under other
#               NCCL variables), dp 2 alone, named …-$DP_TAG
#   strategies  bf16 on Tiny Shakespeare, --dp 2, a sweep for each of $STRAT_RUNS (";"-separated
#               "MODEL ENGINE STRATEGIES RECOMPUTE BATCHES"; default "gpt2-xl candle
#               dp,zero1,zero2,zero3 off,on 4,8,16,32,64": batch doubled until out of memory, a
#               larger batch of a configuration that ran out of memory is not run), $STRAT_STEPS
#               (6) timed steps, --drop-last (full batches only: Tiny Shakespeare makes 2-3 steps
#               an epoch at batch 64 a GPU, and a partial step takes a full one's time, so a large
#               batch's tokens/s would be its epoch tail's); HF's engine runs dp as DDP, zero2 /
#               zero3 as FSDP
set -uo pipefail
M=/tmp/multi
mkdir -p "$M"
CON=$OUT/multi.txt
tarlogs() { (cd /tmp && tar czf "$OUT/multi-logs.tgz" multi); }
# NAME bench-args…: one run, its log alone in $M/NAME/.
run() {
  local name=$1; shift
  mkdir -p "$M/$name"
  echo "--- $name: bench $*" | tee -a "$CON"
  "$B" --log-dir "$M/$name" --no-progress "$@" 2>&1 | grep -v '^  |' | tee -a "$CON"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$CON"
  tarlogs
}
logof() { ls "$M/$1"/*.jsonl 2>/dev/null | head -1; }
R=(--weights random --seed 0 --device cuda --dtype bf16)
LAMBADA=.gpu/lambada_test.jsonl

for stage in "$@"; do
  echo "=== $stage" | tee -a "$CON"
  case $stage in
  tp)
    run card-as-typed --suite lambada --model bloom-7b1 --tp 2
    for tp in 1 2; do
      run "score-bs16-tp$tp" "${R[@]}" --suite lambada --model bloom-7b1 --data $LAMBADA --batch-size 16 --tp $tp
      run "score-bs1-tp$tp" "${R[@]}" --suite lambada --model bloom-7b1 --data $LAMBADA --batch-size 1 \
        --limit "${B1_LIMIT:-500}" --tp $tp
    done
    python3 scripts/compare_runs.py scores "$(logof score-bs16-tp1)" "$(logof score-bs16-tp2)" \
      --spread "$(logof score-bs1-tp1)" 2>&1 | tee -a "$CON"
    for tp in 1 2; do
      run "generate-bs16-tp$tp" "${R[@]}" --suite lambada --mode generate --model bloom-7b1 --data $LAMBADA \
        --batch-size 16 --limit "${GEN_LIMIT:-320}" --tp $tp
      for bs in 1 16; do
        run "suite-bs$bs-tp$tp" "${R[@]}" --suite generation --model bloom-7b1 --prompt-lens 128 \
          --new-tokens 128 --batch-size $bs --limit 5 --tp $tp
      done
    done
    # bf16: near-ties move with the summation order, so the share is reported, not required.
    python3 scripts/compare_runs.py ids "$(logof generate-bs16-tp1)" "$(logof generate-bs16-tp2)" \
      --min-share 0 2>&1 | tee -a "$CON"
    ;;
  tp-decode)
    # One sum inside a CUDA graph, NCCL against the one-shot kernel (the unit-test binary that
    # gpu_checks.sh multi-smoke unpacked).
    if [ -x /tmp/unit-tests ]; then
      /tmp/unit-tests sum_latency_over_two_gpus --ignored --nocapture --test-threads 1 2>&1 | tee -a "$CON"
    fi
    ALL=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny
    for round in $(seq 1 "${TPD_ROUNDS:-2}"); do
      for bs in 1 16; do
        G=("${R[@]}" --suite generation --model bloom-7b1 --prompt-lens 128 --new-tokens 128 --batch-size $bs --limit 5)
        for v in ${TPD_VARIANTS:-tp1 tp2 nosumnorm}; do
          case $v in
          tp1) run "decode-r$round-bs$bs-tp1" "${G[@]}" --tp 1 ;;
          tp2) run "decode-r$round-bs$bs-tp2" "${G[@]}" --tp 2 ;;
          nosumnorm) run "decode-r$round-bs$bs-tp2-nosumnorm" "${G[@]}" --tp 2 --fused "$ALL,oneshot,split-head" ;;
          nopush) run "decode-r$round-bs$bs-tp2-nopush" "${G[@]}" --tp 2 --fused "$ALL,oneshot,split-head,sum-norm" ;;
          nooneshot) run "decode-r$round-bs$bs-tp2-nooneshot" "${G[@]}" --tp 2 --fused "$ALL,split-head" ;;
          nosplithead) run "decode-r$round-bs$bs-tp2-nosplithead" "${G[@]}" --tp 2 --fused "$ALL,oneshot" ;;
          neither) run "decode-r$round-bs$bs-tp2-neither" "${G[@]}" --tp 2 --fused "$ALL" ;;
          *) echo "unknown tp-decode variant $v" >&2; exit 2 ;;
          esac
        done
      done
    done
    ;;
  dp)
    # --drop-last: every timed step 8 x 1024 a rank. wiki.valid makes 242 blocks, 30 batches of 8
    # and one of 2: kept, each epoch ends in a 2-row step at a full step's time (plus new shapes'
    # first launches), and dp 2 reaches an epoch's end twice as often (DP_DROP_LAST=0: kept).
    W=(--suite wikitext2 --model gpt2 --data .gpu/wikitext-2-raw --batch-size 8 --block-size 1024
       --warmup 3 --max-steps $(( ${DP_STEPS:-50} + 3 )))
    [ "${DP_DROP_LAST:-1}" = 0 ] || W+=(--drop-last)
    IFS=';' read -ra variants <<< "${DP_VARIANTS:-}"
    for drop in off on; do
      d=(); [ $drop = off ] && d=(--no-dropout)
      # With $DP_TAG (runs under other environment variables), dp 2 alone, its name tagged.
      [ -n "${DP_TAG:-}" ] || run "dp1-dropout-$drop" "${R[@]}" "${W[@]}" "${d[@]}" --dp 1
      run "dp2-dropout-$drop${DP_TAG:+-$DP_TAG}" "${R[@]}" "${W[@]}" "${d[@]}" --dp 2
      for v in "${variants[@]}"; do  # dp 2 variants (flag sets), after the plain pair
        [ -n "$v" ] || continue
        tag=$(echo "$v" | tr -c 'a-zA-Z0-9=\n' '-' | sed 's/^-*//')
        # shellcheck disable=SC2086  # a variant is several flags
        run "dp2-dropout-$drop-$tag" "${R[@]}" "${W[@]}" "${d[@]}" --dp 2 $v
      done
    done
    ;;
  strategies)
    # STRAT_RUNS: ";"-separated sweeps, each "MODEL ENGINE STRATEGIES RECOMPUTE BATCHES".
    IFS=';' read -ra sweeps <<< "${STRAT_RUNS:-gpt2-xl candle dp,zero1,zero2,zero3 off,on 4,8,16,32,64}"
    for sw in "${sweeps[@]}"; do
      read -r m e st rc bs <<< "$sw"
      run "strategies-$m-$e-$st-$rc-$bs" "${R[@]}" --suite shakespeare --model "$m" --data .gpu/input.txt \
        --dp 2 --engine "$e" --strategies "$st" --recompute "$rc" --batch-sizes "$bs" --drop-last \
        --warmup 2 --max-steps $(( ${STRAT_STEPS:-6} + 2 ))
    done
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
tarlogs
