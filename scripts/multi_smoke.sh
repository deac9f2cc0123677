#!/usr/bin/env bash
# The two-GPU smoke stage (`scripts/gpu_checks.sh multi-smoke`; about a minute): run it first
# whenever a host with two GPUs is at hand, before a change to src/dist, the models' sharding or
# the kernels is called done. Tiny models, fp32, the shipped samples; each check compares two
# runs' logs with scripts/compare_runs.py and the stage stops at the first failure (exit 1):
#   1. the collectives' values across two GPUs, and graph-replayed --tp 2 decoding against one
#      GPU (the ignored unit tests that need two GPUs);
#   2. --tp 2 against one GPU, gpt2-tiny and bloom-tiny: LAMBADA scores within the one-GPU
#      batch-size spread, --mode generate ids identical;
#   3. --dp 2 against one GPU with --grad-accum 2, and --zero 1/2/3 and --dp-overlap (copy-engine
#      sums) against plain --dp 2: the same losses;
#   4. launchers: torchrun on one node, torchrun as two simulated nodes (one GPU each), Open
#      MPI's and Slurm's variables (mpirun / srun where installed, else set by hand: the log
#      says which), each scoring like the one-GPU run.
# Needs: $B (the CUDA + NCCL bench), /tmp/unit-tests (its unit-test binary), $OUT.
set -uo pipefail
S=/tmp/smoke
rm -rf "$S" && mkdir -p "$S"
LOG=$OUT/multi-smoke.txt
say() { echo "$*" | tee -a "$LOG"; }
fail() { say "multi-smoke FAILED: $*"; exit 1; }
# NAME bench-args…: one run (its ranks, if any), its log alone in $S/NAME/.
run() {
  local name=$1; shift
  mkdir -p "$S/$name"
  timeout 180 "$B" --weights random --seed 0 --device cuda --log-dir "$S/$name" --no-progress "$@" \
    > "$S/$name.out" 2>&1 || { tail -20 "$S/$name.out" | tee -a "$LOG"; fail "$name exited $?"; }
  say "ran $name"
}
logof() { # the one log of run NAME (a second --batch-size would have made a sweep of two)
  local logs=("$S/$1"/*.jsonl)
  [ ${#logs[@]} -eq 1 ] && [ -f "${logs[0]}" ] || fail "$1 has no single log: ${logs[*]}"
  echo "${logs[0]}"
}
check() { # compare_runs.py WHAT A B [flags]
  local what=$1 a=$2 b=$3; shift 3
  python3 scripts/compare_runs.py "$what" "$(logof "$a")" "$(logof "$b")" "$@" 2>&1 | sed "s|^|$b vs $a: |" | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "$b vs $a ($what)"
}
# NAME LAUNCHER-NOTE: two rank processes started by hand or by a launcher (the command
# follows), both must exit 0; rank 0's log lands in $S/NAME/.
ranks_done() {
  local name=$1 status=$2
  [ "$status" -eq 0 ] || { tail -20 "$S/$name.out" | tee -a "$LOG"; fail "$name exited $status"; }
  say "ran $name"
}

say "== 1. collectives over two GPUs, graph-replayed --tp 2 decoding"
timeout 300 /tmp/unit-tests over_two_gpus tp2_graph --skip sum_latency --ignored --test-threads 1 2>&1 | tee -a "$LOG" | tail -3
grep -q "test result: ok. 2 passed" "$LOG" || fail "the two-GPU unit tests"

say "== 2. --tp 2 against one GPU"
# One pass a run (no GPU minimum time): these runs check numbers, not speed.
L=(--suite lambada --data data/lambada_sample.jsonl --dtype fp32 --min-time 0 --min-batches 0)
for m in gpt2-tiny bloom-tiny; do
  run "$m-tp1" "${L[@]}" --model $m --batch-size 16
  run "$m-tp1-bs5" "${L[@]}" --model $m --batch-size 5
  run "$m-tp2" "${L[@]}" --model $m --batch-size 16 --tp 2
  check scores "$m-tp1" "$m-tp2" --spread "$(logof "$m-tp1-bs5")"
  run "$m-gen-tp1" "${L[@]}" --model $m --batch-size 16 --mode generate
  run "$m-gen-tp2" "${L[@]}" --model $m --batch-size 16 --mode generate --tp 2
  check ids "$m-gen-tp1" "$m-gen-tp2"
done

say "== 3. data parallel: dp 2 = dp 1 with twice the accumulation; ZeRO 1/2/3 = dp"
W=(--suite wikitext2 --model gpt2-tiny --dtype fp32 --no-dropout --block-size 64 --batch-size 2
   --max-steps 6 --warmup 0 --lr 1e-3)
run dp1-accum2 "${W[@]}" --grad-accum 2
run dp2 "${W[@]}" --dp 2
check losses dp1-accum2 dp2 --rtol 1e-5
for z in 1 2 3; do
  run "dp2-zero$z" "${W[@]}" --dp 2 --zero $z
  check losses dp2 "dp2-zero$z" --rtol 1e-5
done
# --dp-overlap: the started sums through the copy engines (--fused copy-sum) = NCCL's.
run dp2-overlap "${W[@]}" --dp 2 --dp-overlap
if grep -q "copy-engine sums" "$S/dp2-overlap.out"; then say "dp2-overlap: copy-engine sums on"
else say "dp2-overlap: WARNING: no copy-engine sums note in its output (NCCL summed?)"; fi
check losses dp2 dp2-overlap --rtol 1e-5

say "== 4. launchers (gpt2-tiny --tp 2 scoring against one GPU)"
T=(--weights random --seed 0 --device cuda --no-progress "${L[@]}" --model gpt2-tiny --batch-size 16 --tp 2)
TORCHRUN="python3 -m torch.distributed.run"
mkdir -p "$S/torchrun-1node"
timeout 180 $TORCHRUN --nproc-per-node 2 --no-python "$B" "${T[@]}" --log-dir "$S/torchrun-1node" \
  > "$S/torchrun-1node.out" 2>&1
ranks_done torchrun-1node $?
check scores gpt2-tiny-tp1 torchrun-1node --spread "$(logof gpt2-tiny-tp1-bs5)"

# Two nodes on one host: a torchrun a node, one GPU each, meeting at 127.0.0.1.
mkdir -p "$S/torchrun-2nodes"
pids=()
for r in 0 1; do
  CUDA_VISIBLE_DEVICES=$r timeout 180 $TORCHRUN --nnodes 2 --node-rank $r --nproc-per-node 1 \
    --master-addr 127.0.0.1 --master-port 29611 --no-python "$B" "${T[@]}" \
    --log-dir "$S/torchrun-2nodes" >> "$S/torchrun-2nodes.out" 2>&1 &
  pids+=($!)
done
st=0; for p in "${pids[@]}"; do wait "$p" || st=$?; done
ranks_done torchrun-2nodes $st
check scores gpt2-tiny-tp1 torchrun-2nodes --spread "$(logof gpt2-tiny-tp1-bs5)"

# Open MPI and Slurm: their launchers where installed, else their variables set by hand.
by_hand() { # NAME RANK-VAR SIZE-VAR LOCAL-VAR PORT
  local name=$1 rv=$2 sv=$3 lv=$4 port=$5 pids=() st=0
  mkdir -p "$S/$name"
  for r in 0 1; do
    env "$rv=$r" "$sv=2" "$lv=$r" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 180 "$B" "${T[@]}" --log-dir "$S/$name" >> "$S/$name.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || st=$?; done
  ranks_done "$name" $st
  check scores gpt2-tiny-tp1 "$name" --spread "$(logof gpt2-tiny-tp1-bs5)"
}
if command -v mpirun > /dev/null; then
  mkdir -p "$S/mpirun"
  timeout 180 mpirun --allow-run-as-root -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29621 \
    -x NCCL_NVLS_ENABLE "$B" "${T[@]}" --log-dir "$S/mpirun" > "$S/mpirun.out" 2>&1
  ranks_done mpirun $?
  check scores gpt2-tiny-tp1 mpirun --spread "$(logof gpt2-tiny-tp1-bs5)"
else
  say "no mpirun on this host: Open MPI's variables set by hand"
  by_hand ompi-vars OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK 29621
fi
say "Slurm's variables set by hand (no Slurm allocation on these hosts)"
by_hand slurm-vars SLURM_PROCID SLURM_NTASKS SLURM_LOCALID 29631

say "multi-smoke: all checks passed"
(cd /tmp && tar czf "$OUT/multi-smoke-logs.tgz" smoke)
