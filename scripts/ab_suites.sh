#!/usr/bin/env bash
# One GPU, one call (#35 item 4, #38 item 5). Needs .gpu/bench.xz (this binary),
# .gpu/bench-before.xz (the binary before the restructure) and .gpu/lambada_test.jsonl; $OUT.
#   ab      the previous binary and this one alternating, $AB_ROUNDS (2) rounds, candle, bf16:
#           generation suite (prompt 128 + 128, $AB_PROMPTS (5) prompts) gpt2 batch 1 and 16,
#           bloom-560m batch 16; LAMBADA scoring bloom-560m batch 16 (first $AB_LIMIT (1600)).
#           This binary runs one pass (--min-time 0 --min-batches 0), as the previous one did
#           (AB_BEFORE_MINIMUMS=1: a previous binary that has the flags gets them too).
#   train   WikiText-2 fine-tuning of gpt2, the two binaries alternating ABBA, $AB_ROUNDS rounds.
#   score   LAMBADA scoring, batch 16, the whole set, the two binaries alternating ABBA,
#           $AB_ROUNDS rounds, on each of $AB_MODELS (gpt2 bloom-560m bloom-7b1), both with
#           the GPU's minimums (10 s and 10 batches).
#   score-fused  the same scoring runs with this binary alone, `--fused` sets alternating ABBA:
#           every path, and every path but `prefill` and `decode` ($AB_FUSED_BEFORE: the
#           scoring forward of the binaries before 9203edf, composed attention and separate
#           adds and norms); needs no previous binary.
#   repeat  `--repeat 5` of gpt2 LAMBADA scoring, batch 16: with this binary's minimums
#           (10 s and 10 batches on a GPU) and with one pass (the previous behaviour).
# Logs -> $OUT/ab-logs.tgz after every run; console -> $OUT/ab.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
L=/tmp/ab; mkdir -p "$L"
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2" && chmod +x "$2"; }
unxz .gpu/bench.xz /tmp/bench
[ -f .gpu/bench-before.xz ] && unxz .gpu/bench-before.xz /tmp/bench-before  # ab, train, score
R=(--weights random --seed 0 --device cuda --dtype bf16 --engine candle --no-progress)
run() { # NAME BIN ARGS…
  local name=$1 bin=$2; shift 2
  mkdir -p "$L/$name"
  echo "--- $name: $bin $*" | tee -a "$OUT/ab.txt"
  "$bin" "${R[@]}" --log-dir "$L/$name" "$@" 2>&1 | grep -v '^  |' | tee -a "$OUT/ab.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/ab.txt"
  (cd /tmp && tar czf "$OUT/ab-logs.tgz" ab)
}
for stage in "$@"; do
  case $stage in
  ab)
    G=(--suite generation --prompt-lens 128 --new-tokens 128 --limit "${AB_PROMPTS:-5}")
    S=(--suite lambada --data .gpu/lambada_test.jsonl --limit "${AB_LIMIT:-1600}")
    for r in $(seq 1 "${AB_ROUNDS:-2}"); do
      for who in before new; do
        bin=/tmp/bench; one=(--min-time 0 --min-batches 0)
        # A previous binary without --min-time / --min-batches (before 0f427b1) runs one pass
        # anyway; AB_BEFORE_MINIMUMS=1 passes it the flags too.
        [ $who = before ] && { bin=/tmp/bench-before; [ -n "${AB_BEFORE_MINIMUMS:-}" ] || one=(); }
        run "r$r-$who-gen-gpt2-bs1" $bin "${G[@]}" --model gpt2 --batch-size 1 "${one[@]}"
        run "r$r-$who-gen-gpt2-bs16" $bin "${G[@]}" --model gpt2 --batch-size 16 "${one[@]}"
        run "r$r-$who-gen-bloom-560m-bs16" $bin "${G[@]}" --model bloom-560m --batch-size 16 "${one[@]}"
        run "r$r-$who-score-bloom-560m-bs16" $bin "${S[@]}" --model bloom-560m --batch-size 16 "${one[@]}"
      done
    done
    ;;
  train)
    # WikiText-2 fine-tuning, gpt2 bf16 8 x 1024, dropout off, 5 warm-up + $AB_STEPS (30) steps
    # (needs .gpu/wikitext-2-raw): the previous binary and this one alternating.
    W=(--suite wikitext2 --model gpt2 --data .gpu/wikitext-2-raw --batch-size 8 --block-size 1024
       --no-dropout --warmup 5 --max-steps $(( ${AB_STEPS:-30} + 5 )))
    # ABBA: odd rounds run the previous binary first, even rounds this one (an order effect,
    # e.g. the GPU's clocks after the run before, then shows as a swap between rounds).
    for r in $(seq 1 "${AB_ROUNDS:-2}"); do
      order="before new"; [ $((r % 2)) = 0 ] && order="new before"
      for who in $order; do
        bin=/tmp/bench; [ $who = before ] && bin=/tmp/bench-before
        run "r$r-$who-train-gpt2" $bin "${W[@]}"
      done
    done
    ;;
  score)
    S=(--suite lambada --data .gpu/lambada_test.jsonl --batch-size 16)
    for m in ${AB_MODELS:-gpt2 bloom-560m bloom-7b1}; do
      for r in $(seq 1 "${AB_ROUNDS:-2}"); do
        order="before new"; [ $((r % 2)) = 0 ] && order="new before"
        for who in $order; do
          bin=/tmp/bench; [ $who = before ] && bin=/tmp/bench-before
          run "r$r-$who-score-$m-bs16" $bin "${S[@]}" --model "$m"
        done
      done
    done
    ;;
  score-fused)
    S=(--suite lambada --data .gpu/lambada_test.jsonl --batch-size 16)
    before=${AB_FUSED_BEFORE:-lt,softmax,bias-act,layer-norm,embedding,gemv,skinny}
    for m in ${AB_MODELS:-gpt2 bloom-560m bloom-7b1}; do
      for r in $(seq 1 "${AB_ROUNDS:-2}"); do
        order="before new"; [ $((r % 2)) = 0 ] && order="new before"
        for who in $order; do
          fused=all; [ $who = before ] && fused=$before
          run "r$r-$who-score-$m-bs16" /tmp/bench "${S[@]}" --model "$m" --fused "$fused"
        done
      done
    done
    ;;
  repeat)
    S=(--suite lambada --data .gpu/lambada_test.jsonl --model gpt2 --batch-size 16 --repeat 5)
    run repeat-minimums /tmp/bench "${S[@]}"
    run repeat-one-pass /tmp/bench "${S[@]}" --min-time 0 --min-batches 0
    ;;
  *) echo "unknown stage $stage (ab, train, score, score-fused, repeat)" >&2; exit 2 ;;
  esac
done
