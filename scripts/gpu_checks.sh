#!/usr/bin/env bash
# One batch of GPU-host checks per device call; stages run in the order given.
# Run from the repo root on the GPU host; writes everything under $OUT (<= 8 files come back).
#   fixtures       HF reference fixtures (CPU fp32) for tests/fixtures           -> fixtures.tgz
#   shakespeare    --suite shakespeare, gpt2 bf16 8 x 1024, one epoch: candle and compiled HF
#                  (needs .gpu/input.txt, Tiny Shakespeare)                    -> shakespeare.txt
#   hf-parallel    the HF worker's DDP / FSDP strategies under torchrun (one process) against the
#                  plain worker                                                 -> hf-parallel.txt
#   hf-dp-cpu      bench's torchrun launch of the HF strategies on CPU ranks (gloo) against one
#                  HF process and candle's --dp 2                                -> hf-dp-cpu.txt
#   strategies-1gpu gpt2-xl bf16 on Tiny Shakespeare, batch x --recompute off,on, OOM recorded:
#                  the single-GPU column of the strategy table                 -> strategies.txt
#   train-grads    HF first-step gradients for the shipped train fixtures (CPU fp32)  -> train-grads.tgz
#   train-fixtures HF training fixtures (CPU fp32): tests/fixtures/train-{gpt2,bloom} -> train-fixtures.tgz
#   numerics       real-shape HF references made here (gpt2, bloom-560m; fp32, bf16) vs ours
#   lambada-small  full LAMBADA, batch 16: gpt2 in 4 precisions, bloom-560m in 3
#   lambada-7b1    full LAMBADA, batch 16: bloom-7b1 in bf16, fp16, fp32; plus a checkpoint
#                  round trip (--save-weights, then --model-dir) for load time and host RSS
#   env            `bench env` (text, JSON: -> env.txt, env.json), `bench env --check-trackers`
#                  on every GPU (1 GiB tensor vs NVML/pool; energy counter vs power x time;
#                  -> trackers.txt), and gpt2 bf16 --limit 1000 whose log must carry the NVML
#                  memory / energy / clock / MFU fields (-> env-run.jsonl)
#   hf-smoke       candle vs HF on a tiny model: stops the batch if the real worker fails
#   hf-gpt2, hf-bloom-560m, hf-bloom-7b1-16, hf-bloom-7b1-1
#                  candle vs HF (`--engine both`; sdpa where supported, eager for gpt2 too),
#                  full LAMBADA, fp32/bf16/fp16 x batch 16/1 (bloom-7b1 batch 1: --limit $B1_LIMIT)
#   sweep-repeat   gpt2 bf16 batch 16, full LAMBADA, --repeat 5 (each run its own process):
#                  the CV of samples/s                                          -> sweeps.tgz
#   sweep-oom      bloom-7b1 bf16, first 2048 LAMBADA passages, batch 1..2048 doubling, until
#                  out of memory (--run-timeout cuts a stalled run)
#   wikitext2      WikiText-2 fine-tuning, gpt2 124M (random init), batch 8, block 1024:
#                  first a 2-step fp32 candle-vs-HF run with --no-dropout (the first-step loss
#                  must agree, else exit 1 is printed), then per dtype in $DTYPES (fp32 tf32
#                  bf16) 3 untimed warm-up steps + $TRAIN_STEPS (200) timed, `--engine
#                  $TRAIN_ENGINE` (both: candle, then HF on the same weights and blocks, config
#                  dropout as HF's default; side-by-side table). Trains on wiki.valid.raw,
#                  evaluates on wiki.test.raw from .gpu/wikitext-2-raw/; $TRAIN_FLAGS are added
#                  to every run (e.g. --phase-times).                       -> train-logs.tgz
#   multi-smoke    two GPUs, about a minute (scripts/multi_smoke.sh): the collectives and graphed
#                  --tp 2 decoding (the two-GPU unit tests), --tp 2 against one GPU (scores within
#                  the batch-size spread, generated ids identical), dp 2 = dp 1 with twice the
#                  accumulation, ZeRO 1/2/3 = dp, torchrun (one node, two simulated nodes), Open
#                  MPI's and Slurm's variables. Stops the batch on the first failure; run it first
#                  on a multi-GPU host, before a change to src/dist, sharding or kernels is done
#   fp8            fp8 weights against bf16 (scripts/fp8_measure.sh): a gpt2 trained here, scored
#                  and generated from its checkpoint at both dtypes (perplexity, ids identical), and
#                  decode speed of $FP8_MODELS at batch 1 / 16                   -> fp8.txt, fp8-logs.tgz
#   serving        the serving suite, candle and HF (scripts/serving_measure.sh): an HF smoke run,
#                  then a rate sweep an engine for $SERVE_MODELS              -> serving.txt, serving-logs.tgz
#                  ($SERVE_ENGINES: candle candle-static hf-static hf, and candle-tp2 /
#                  candle-static-tp2: candle over --tp 2, two GPUs, one run a rate)
#   multi-tp, multi-tp-decode, multi-dp, multi-strategies
#                  two-GPU measurements (scripts/multi_measure.sh tp|tp-decode|dp|strategies) -> multi-logs.tgz
#   dp             data-parallel fine-tuning of $DP_MODEL (gpt2), batch $DP_BATCH (8) per rank, block 1024, on $DP_SIZES
#                  (2) GPUs: first fp32 --no-dropout, $DP_EQ_STEPS (10; 0 skips) steps, dp N against dp 1
#                  with --grad-accum N (the same global batch: equal loss curves), then bf16 with
#                  dropout, 3 warm-up + $DP_STEPS (50) timed steps at dp 1, dp N, dp N --zero 1
#                  (the ZeRO-1 runs only for the sizes in $DP_ZERO_SIZES, default all);
#                  `extract-metrics --table dp-report` makes both tables from  -> dp-logs.tgz
#   gen-ab         .gpu/bench-before and this binary alternating (and $GEN_AB_ENGINES): candle's generation suite on
#                  $GEN_MODELS, batch 1 and 16, prompt 128 + 128            -> gen-logs.tgz
#   step-ab        `--fused all` and `all,step` alternating: candle's generation suite on
#                  $GEN_MODELS, batch $STEP_BATCHES, $STEP_ROUNDS rounds      -> gen-logs.tgz
#   gen-7b1-lambada  LAMBADA --mode generate, bloom-7b1, --engine both, batch 16, first
#                  $GEN_LIMIT passages                                      -> hf-best-logs.tgz
#   dp-ab          .gpu/bench-before and this binary alternating: gpt2 bf16 dp 1 and dp 2, $DP_STEPS
#                  (50) timed steps, without dropout, then with it           -> dp-logs.tgz
#   decode-ncu     ncu sections of the decode attention and add + layer norm kernels in graphed
#                  decode steps of $DECODE_NCU_MODEL (bloom-560m)            -> decode-ncu.txt
#   dp-ctas        gpt2 bf16 --no-dropout: dp 1, dp 2, dp 2 --dp-overlap at each NCCL_MAX_CTAS
#                  of $DP_CTAS (auto 16 8 4 2)                               -> dp-logs.tgz
#   perf-profile   ncu kernel times of one forward / one training step, candle and HF, same call
#                  index (TB_CUDA_PROFILE): gpt2 bs16 and bs1, bloom-560m and bloom-7b1 bs16,
#                  gpt2 training step; scripts/kernel_breakdown.py sums them by op -> perf-profile.tgz
#                  (opt-in cases train-gpt2-medium, train-gpt2-large: those models' training
#                  step, HF compiled for the hf engine)
#                  ($PROF_ENGINES: candle hf; $PROF_CASES: those five; $PROF_FLAGS go to the
#                  training run, e.g. PROF_ENGINES=candle PROF_FLAGS="--backward autograd")
#   gemv-ncu       ncu sections of one layer's decode GEMVs, $GEMV_NCU_MODEL (bloom-7b1) batch 1 at
#                  fp8 and bf16, and the fp8 GEMV's SASS          -> gemv-ncu.txt, gemv-sass.txt
#   flash-profile  ncu sections of the fused attention's kernels in a gpt2 training step -> flash-ncu.txt
#   kernels        the fused kernels against candle's composed ops (src/gpu_tests/) and
#                  the NCCL collectives on one rank (src/dist/gpu_tests.rs): the tests whose names
#                  match a filter of $KERNEL_FILTER (default "kernels:: dist:: gpu_tests::")
#                  from the CUDA unit-test binary .gpu/tests.{xz,gz}           -> kernels.txt
#   criterion      benches/fused_kernels.rs (criterion) from .gpu/fused_kernels.xz: the fused
#                  kernels against candle's composed ops, timed on the GPU        -> criterion.txt
#   perf-compare   the #10 targets in one run: candle vs HF (`--engine both`), bf16, LAMBADA:
#                  gpt2 / bloom-560m / bloom-7b1 batch 16 (full set), gpt2 batch 1 (--limit
#                  $B1_LIMIT); WikiText-2 gpt2 fine-tuning, $PERF_STEPS (50) timed steps with
#                  --phase-times ($PERF_CASES picks rows: gpt2-bs16 gpt2-bs1 bloom-560m-bs16
#                  bloom-7b1-bs16 train-gpt2). $PERF_FLAGS go to every run, $PERF_ENGINE (both) picks the
#                  engines (candle + PERF_FLAGS="--fused none": the "before")  -> perf-logs.tgz
#   gen-fixtures   HF generate() references (fp32, CPU and GPU) for tests/fixtures/generate
#                  (scripts/hf_fixtures/make_generate_fixtures.py)           -> gen-fixtures.tgz
#   gen-agree      candle vs HF generate(), fp32, LAMBADA --mode generate, 256 passages: the share of
#                  identical generated ids ($GEN_MODELS)                     -> gen-agree.txt
#   gen-suite      the generation-suite half of `generate` alone                -> gen-logs.tgz
#   generate       #12/#20 benchmarks, bf16: LAMBADA --mode generate, candle and HF (sdpa where
#                  supported), batch 16 (first $GEN_LIMIT (1600) passages) and batch 1 (first
#                  $GEN_B1_LIMIT (200)); the generation suite, prompt 128 + 128 new tokens, batch 1
#                  and 16, candle, HF and HF --hf-compile (static KV cache); models $GEN_MODELS
#                  (gpt2 bloom-560m); engine names: candle, candle-nodecode (every fused path
#                  but the decode kernels: their "before"), candle-nograph (the decode kernels
#                  without the CUDA graph), hf, hf-eager, hf-sdpa, hf-compile -> gen-logs.tgz
#   train-compare  #21: the training suite's three engines in one table: $CMP_MODEL (gpt2 124M, random
#                  init), bf16, batch $CMP_BATCH (8) x block 1024, WikiText-2 (wiki.valid.raw, eval wiki.test.raw),
#                  dropout off (llm.c has none; CMP_DROPOUT=1: the config's 0.1), 10 warm-up +
#                  $CMP_STEPS (50) timed steps, `--engine $CMP_ENGINES` (candle,hf,llmc)
#                  `--hf-compile` (a sweep: one process per engine; HF
#                  compiled as Trainer's torch_compile=True, compilation in the warm-up; llm.c's
#                  train_gpt2cu from .gpu/train_gpt2cu, a copy of /work/shared/gpu/llmc/), then
#                  eager HF alone for the compile gain (CMP_HF_EAGER=0: not), then candle alone with each
#                  --backward of $CMP_BACKWARDS (e.g. "manual autograd"), then candle with each
#                  ';'-separated flag set of $CMP_CANDLE_FLAGS (e.g. "--recompute"), then candle
#                  from .gpu/bench-before.{xz,gz} when there (a previous binary: the before of a
#                  change, in the same call; its log header names its commit). The CSV (engine candle / hf / hf-compile /
#                  llmc, samples/s, tokens/s, peak memory, MFU) needs .gpu/extract-metrics.{xz,gz} (a
#                  report build), else make it from the logs: -> train-compare-logs.tgz, train-compare.csv
#   ab             the previous binary (.gpu/bench-before) against this one, candle alone, alternating:
#                  $AB_MODELS (bloom-560m) LAMBADA batch 16, scoring and generation -> hf-best-logs.tgz
#   hf-probe       #40: HF's probe (attention x torch.compile) against each configuration run
#                  explicitly, candle beside it: generation suite, $PROBE_MODELS (gpt2), batches
#                  $PROBE_BATCHES (1 16), explicit configurations at $PROBE_EXPLICIT (16)
#                                                                           -> hf-probe-logs.tgz
#   hf-best        candle vs HF at HF's best configuration (#22 item 5), bf16, `--engine both` with
#                  the default `--hf-attn best` (eager and sdpa timed on the first batch of each
#                  of the first 4 padded lengths, cold, the faster kept; BLOOM: eager only), for each of
#                  $BEST_MODELS (gpt2 bloom-560m): full LAMBADA batch 16, and `--mode generate`
#                  batch 16 on the first $GEN_LIMIT (1600) passages; then gpt2 scoring with HF
#                  `--hf-compile` (padded to multiples of 64, every bucket compiled in the
#                  warm-up). Logs -> hf-best-logs.tgz, console -> hf-best.txt, and with
#                  .gpu/extract-metrics.{xz,gz} the CSV and ratio table -> hf_best.csv, hf_best_ratio.md
#                  (estimated 3-5 minutes on an H100, most of it HF's import, load and
#                  compilation; not run yet: BEST_MODELS=gpt2 drops the bloom-560m runs)
# Expects .gpu/ (git-ignored, carried): vocab/{encoder.json,vocab.bpe}, bench.{xz,gz}, lambada_test.jsonl;
# for hf-best's CSV also extract-metrics.{xz,gz} (a CPU build: cargo build --release --bin extract-metrics).
set -uo pipefail
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/logs
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared hosts (KINDS.md)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  head -1 /proc/driver/nvidia/version
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee "$OUT/host.txt"
unpack() { # NAME DEST: .gpu/NAME.xz (half gzip's size: the carry limit) or .gpu/NAME.gz -> DEST
  if [ -f ".gpu/$1.xz" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' ".gpu/$1.xz" "$2"
  elif [ -f ".gpu/$1.gz" ]; then gunzip -c ".gpu/$1.gz" > "$2"
  else return 1
  fi && chmod +x "$2"
}
unpack bench /tmp/bench
B=/tmp/bench
FIX="python3 scripts/hf_fixtures/make_fixtures.py --vocab-dir .gpu/vocab --data data/lambada_sample.jsonl"
LOGS=/tmp/logs
lambada() { # model dtype [extra flags]
  local m=$1 dt=$2; shift 2
  $B --suite lambada --model "$m" --weights random --seed 0 --device cuda --dtype "$dt" \
    --batch-size 16 --data .gpu/lambada_test.jsonl --log-dir $LOGS --no-progress "$@" 2>&1 | tee -a "$OUT/lambada.txt"
}

both() { # model dtype batch [extra flags]: candle vs HF, same weights and data
  local m=$1 dt=$2 bs=$3; shift 3
  $B --engine both --suite lambada --model "$m" --weights random --seed 0 --device cuda --dtype "$dt" \
    --batch-size "$bs" --data .gpu/lambada_test.jsonl --log-dir /tmp/logs --no-progress "$@" 2>&1 | tee -a "$OUT/hf.txt"
  (cd /tmp && tar czf "$OUT/logs.tgz" logs)  # after every run: a time-out keeps what finished
}
hf_eager() { # model dtype batch: HF with eager attention
  local m=$1 dt=$2 bs=$3
  $B --engine hf --hf-attn eager --suite lambada --model "$m" --weights random --seed 0 --device cuda \
    --dtype "$dt" --batch-size "$bs" --data .gpu/lambada_test.jsonl --log-dir /tmp/logs --no-progress 2>&1 | tee -a "$OUT/hf.txt"
  (cd /tmp && tar czf "$OUT/logs.tgz" logs)
}
B1_LIMIT=${B1_LIMIT:-1000}
# Sweep logs stay on the (git-ignored) results/logs of the host's checkout between calls.
SWEEPS=$PWD/results/logs/gpu-sweeps
TRAIN_STEPS=${TRAIN_STEPS:-200}
TRAIN_ENGINE=${TRAIN_ENGINE:-both}
train_run() { # model dtype [extra flags]: run_clm-style fine-tuning, candle and/or HF
  local m=$1 dt=$2; shift 2
  $B --suite wikitext2 --engine "$TRAIN_ENGINE" --model "$m" --weights random --seed 0 --device cuda \
    --dtype "$dt" --batch-size 8 --block-size 1024 --data .gpu/wikitext-2-raw \
    --log-dir /tmp/train-logs --no-progress ${TRAIN_FLAGS:-} "$@" 2>&1 | tee -a "$OUT/train.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/train.txt"
  (cd /tmp && tar czf "$OUT/train-logs.tgz" train-logs)  # after every run: a time-out keeps what finished
}
train() { # model dtype [extra flags]: 3 untimed warm-up steps + $TRAIN_STEPS timed
  train_run "$@" --warmup 3 --max-steps $((TRAIN_STEPS + 3))
}

dp_run() { # model dtype [extra flags]: rank 0's log goes to /tmp/dp-logs
  local m=$1 dt=$2; shift 2
  $B --suite wikitext2 --model "$m" --weights random --seed 0 --device cuda --dtype "$dt" \
    --batch-size "${DP_BATCH:-8}" --block-size 1024 --data .gpu/wikitext-2-raw --log-dir /tmp/dp-logs \
    --no-progress "$@" 2>&1 | tee -a "$OUT/dp.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/dp.txt"
  (cd /tmp && tar czf "$OUT/dp-logs.tgz" dp-logs)  # after every run: a time-out keeps what finished
}

# Profiled scoring and generation runs: one pass (the GPU's --min-time / --min-batches would
# only add calls ncu does not profile, each slowed by it).
ONE_PASS="--min-time 0 --min-batches 0"
NCU="ncu --profile-from-start off --clock-control none --cache-control none --target-processes all --metrics gpu__time_duration.sum"
profile() { # name call-index bench-args...: one call's kernels, as CSV in /tmp/prof/$name.csv
  local name=$1 at=$2; shift 2
  mkdir -p /tmp/prof
  TB_CUDA_PROFILE=$at $NCU -f -o /tmp/prof/$name $B --weights random --seed 0 --device cuda --dtype "${PROF_DTYPE:-bf16}" \
    --log-dir /tmp/prof-logs --no-progress "$@" > /tmp/prof/$name.txt 2>&1
  echo "$name: exit $? $(grep -c . /tmp/prof/$name.txt) lines"
  ncu -i /tmp/prof/$name.ncu-rep --csv --page raw --print-units base --metrics gpu__time_duration.sum > /tmp/prof/$name.csv
  rm -f /tmp/prof/$name.ncu-rep
}
perf_run() { # bench args: one timed run into /tmp/perf-logs
  $B --weights random --seed 0 --device cuda --dtype bf16 --log-dir /tmp/perf-logs --no-progress "$@" 2>&1 | tee -a "$OUT/perf.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/perf.txt"
  (cd /tmp && tar czf "$OUT/perf-logs.tgz" perf-logs)
}

cmp_run() { # bench args: one train-compare invocation into /tmp/cmp-logs (children's stderr dropped)
  local drop=--no-dropout; [ -n "${CMP_DROPOUT:-}" ] && drop=""  # CMP_DROPOUT=1: the config's dropout (0.1)
  $B --suite wikitext2 --model "${CMP_MODEL:-gpt2}" --weights random --seed 0 --device cuda --dtype bf16 \
    --batch-size "${CMP_BATCH:-8}" --block-size 1024 --data .gpu/wikitext-2-raw $drop --warmup 10 \
    --max-steps $(( ${CMP_STEPS:-50} + 10 )) --log-dir /tmp/cmp-logs --no-progress "$@" 2>&1 \
    | grep -v '^  |' | tee -a "$OUT/train-compare.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/train-compare.txt"
  (cd /tmp && tar czf "$OUT/train-compare-logs.tgz" cmp-logs)  # after every run: a time-out keeps what finished
}

best_run() { # bench args: one run at HF's best configuration into /tmp/hf-best-logs
  $B --weights random --seed 0 --device cuda --dtype bf16 --batch-size 16 --data .gpu/lambada_test.jsonl \
    --log-dir /tmp/hf-best-logs --no-progress "$@" 2>&1 | tee -a "$OUT/hf-best.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/hf-best.txt"
  (cd /tmp && tar czf "$OUT/hf-best-logs.tgz" hf-best-logs)  # after every run: a time-out keeps what finished
}

probe_run() { # NAME bench-args: one generation-suite run (prompt 128 + 128) into /tmp/hf-probe/NAME
  local name=$1; shift
  mkdir -p "/tmp/hf-probe/$name"
  echo "--- $name: $*" | tee -a "$OUT/hf-probe.txt"
  $B --suite generation --prompt-lens 128 --new-tokens 128 --limit "${PROBE_CALLS:-5}" --weights random \
    --seed 0 --device cuda --dtype bf16 --log-dir "/tmp/hf-probe/$name" --no-progress "$@" 2>&1 \
    | tee -a "$OUT/hf-probe.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/hf-probe.txt"
  (cd /tmp && tar czf "$OUT/hf-probe-logs.tgz" hf-probe)
}

GEN_LIMIT=${GEN_LIMIT:-1600}
NO_STEP=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
NO_STEP=$NO_STEP,residual,gemv,skinny,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies
NO_STEP=$NO_STEP,ln-residual,flash-dq
gen_run() { # engine model batch [extra flags]: one generation run into /tmp/gen-logs
  local e=$1 m=$2 bs=$3; shift 3
  local hf=()
  case $e in
  hf-compile) e=hf; hf=(--hf-compile) ;;
  hf-eager) e=hf; hf=(--hf-attn eager) ;;
  hf-sdpa) e=hf; hf=(--hf-attn sdpa) ;;
  candle-nodecode) e=candle; hf=(--fused lt,softmax,bias-act,layer-norm,cross-entropy) ;;  # the "before" of the decode kernels
  candle-nograph) e=candle; hf=(--fused lt,softmax,bias-act,layer-norm,cross-entropy,decode) ;;  # the decode kernels, eager
  candle-noskinny) e=candle; hf=(--fused lt,softmax,bias-act,layer-norm,cross-entropy,decode,graph,gemv) ;;  # cuBLAS's LM head
  before) e=candle; local B=/tmp/bench-before ;;  # the previous binary (.gpu/bench-before)
  candle-nostep) e=candle; hf=(--fused "$NO_STEP") ;;  # every path by name (step was in all before ef7240e)
  candle-step) e=candle; hf=(--fused all,step) ;;  # all and the opt-in one-kernel decode step
  esac
  $B --engine "$e" "${hf[@]}" --model "$m" --weights random --seed 0 --device cuda --dtype bf16 \
    --batch-size "$bs" --log-dir /tmp/gen-logs --no-progress "$@" 2>&1 | grep -v "^  |" | tee -a "$OUT/gen.txt"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/gen.txt"
  (cd /tmp && tar czf "$OUT/gen-logs.tgz" gen-logs)  # after every run: a time-out keeps what finished
}

for stage in "$@"; do
  echo "=== $stage"
  case $stage in
  hf-probe)
    # #40: HF's probe (attention x torch.compile, cold then warm) against every configuration
    # run explicitly, and candle beside it: the generation suite (prompt 128 + 128), bf16, for
    # $PROBE_MODELS (gpt2) at each batch of $PROBE_BATCHES (1 16): `--engine both` (the probe
    # chooses HF's configuration), then HF at each of $PROBE_CONFIGS (eager sdpa eager+compile
    # sdpa+compile) for the batches of $PROBE_EXPLICIT (16). Logs -> hf-probe-logs.tgz.
    for m in ${PROBE_MODELS:-gpt2}; do
      for bs in ${PROBE_BATCHES:-1 16}; do
        probe_run "$m-bs$bs-both" --engine both --model "$m" --batch-size "$bs"
      done
      for bs in ${PROBE_EXPLICIT:-16}; do
        for c in ${PROBE_CONFIGS:-eager sdpa eager+compile sdpa+compile}; do
          probe_run "$m-bs$bs-hf-$c" --engine hf --hf-config "$c" --model "$m" --batch-size "$bs"
        done
      done
    done
    ;;
  gen-profile)
    # One candle generate call (batch $GEN_PROF_BATCH (1), prompt 128, 16 new tokens: a prefill
    # and 15 decode steps) under ncu, kernels summed by op; and the same call's wall time without ncu.
    bs=${GEN_PROF_BATCH:-1}
    G="--suite generation --prompt-lens 128 --new-tokens ${GEN_PROF_NEW:-16} --batch-size $bs --limit 1 $ONE_PASS"
    for m in ${GEN_PROF_MODELS:-gpt2}; do profile gen-$m-bs$bs 2 $G --model $m; done
    python3 scripts/kernel_breakdown.py /tmp/prof/gen-*.csv --top 12 | tee "$OUT/gen-profile.txt"
    (cd /tmp && tar czf "$OUT/gen-profile.tgz" prof)
    ;;
  ab)
    # The previous binary (.gpu/bench-before) and this one, alternating, in one call: candle on
    # $AB_MODELS (bloom-560m), LAMBADA batch 16, scoring and --mode generate (first $GEN_LIMIT
    # passages), twice each. Logs -> hf-best-logs.tgz (each header names its commit).
    unpack bench-before /tmp/bench-before || { echo "no .gpu/bench-before.{xz,gz}" >&2; exit 1; }
    for m in ${AB_MODELS:-bloom-560m}; do
      for bin in /tmp/bench-before $B /tmp/bench-before $B; do
        B=$bin best_run --engine candle --model "$m" --limit "$GEN_LIMIT"
        B=$bin best_run --engine candle --model "$m" --mode generate --limit "$GEN_LIMIT"
      done
    done
    ;;
  hf-best)
    for m in ${BEST_MODELS:-gpt2 bloom-560m}; do
      best_run --engine both --model "$m"
      best_run --engine both --model "$m" --mode generate --limit "$GEN_LIMIT"
    done
    # Compiled HF (the candle run of the same configuration is above): --pad-multiple defaults
    # to 64, the warm-up runs the first batch of every bucket, so compilation stays untimed.
    best_run --engine hf --hf-compile --model gpt2
    if unpack extract-metrics /tmp/extract-metrics; then
      /tmp/extract-metrics -i /tmp/hf-best-logs -o "$OUT/hf_best.csv"
      /tmp/extract-metrics -i /tmp/hf-best-logs --ratio candle/hf -o "$OUT/hf_best_ratio.md"
      cat "$OUT/hf_best_ratio.md" | tee -a "$OUT/hf-best.txt"
    else
      echo "no .gpu/extract-metrics.{xz,gz}: extract-metrics -i hf-best-logs -o hf_best.csv after unpacking" | tee -a "$OUT/hf-best.txt"
    fi
    ;;
  gen-fixtures)
    # Written over the checkout's tests/fixtures/generate (its checkpoints are kept).
    python3 scripts/hf_fixtures/make_generate_fixtures.py 2>&1 | tail -20
    tar czf "$OUT/gen-fixtures.tgz" tests/fixtures/generate
    ;;
  gen-agree)
    # Correctness of the decode path on real shapes: candle vs HF generate in fp32 (ids must
    # agree but for ties), LAMBADA --mode generate, first 256 passages, batch 16.
    for m in ${GEN_MODELS:-gpt2 bloom-560m}; do
      $B --engine both --mode generate --model "$m" --weights random --seed 0 --device cuda --dtype fp32 \
        --batch-size 16 --data .gpu/lambada_test.jsonl --limit 256 --hf-attn eager --log-dir /tmp/gen-logs \
        --no-progress 2>&1 | grep -v "^  |" | tee -a "$OUT/gen-agree.txt"
    done
    ;;
  gen-ab)
    # The previous binary (.gpu/bench-before) and this one, alternating: candle's generation
    # suite on $GEN_MODELS, batch 1 and 16, prompt 128 + 128, $GEN_CALLS calls; each engine of
    # $GEN_AB_ENGINES (before candle; gen_run's names, "before" the previous binary) in turn.
    unpack bench-before /tmp/bench-before || { echo "no .gpu/bench-before.{xz,gz}" >&2; exit 1; }
    for m in ${GEN_MODELS:-gpt2 bloom-560m}; do
      for bs in 1 16; do
        for e in ${GEN_AB_ENGINES:-before candle}; do
          gen_run $e $m $bs --suite generation --prompt-lens 128 --new-tokens 128 --limit "${GEN_CALLS:-10}"
        done
      done
    done
    ;;
  step-ab)
    # The decode step as one kernel (`--fused all,step`) against the same binary without it
    # (`all`), alternating: the generation suite (prompt 128 + 128, $GEN_CALLS calls) on
    # $GEN_MODELS at each batch of $STEP_BATCHES (1 4), $STEP_ROUNDS (2) rounds.
    for r in $(seq "${STEP_ROUNDS:-2}"); do
      for m in ${GEN_MODELS:-gpt2 bloom-560m}; do
        for bs in ${STEP_BATCHES:-1 4}; do
          for e in candle candle-step; do
            gen_run $e $m $bs --suite generation --prompt-lens 128 --new-tokens 128 --limit "${GEN_CALLS:-10}"
          done
        done
      done
    done
    ;;
  gen-7b1-lambada)
    # LAMBADA --mode generate, bloom-7b1, batch 16, first $GEN_LIMIT passages, candle and HF.
    best_run --engine both --model bloom-7b1 --mode generate --limit "$GEN_LIMIT"
    ;;
  gen-suite)
    # The generation suite only (the part the CUDA graph changes): $GEN_SUITE_ENGINES x batch 1, 16.
    for m in ${GEN_MODELS:-gpt2 bloom-560m}; do
      for e in ${GEN_SUITE_ENGINES:-candle hf hf-compile}; do
        for bs in 1 16; do
          gen_run $e $m $bs --suite generation --prompt-lens 128 --new-tokens 128 --limit "${GEN_CALLS:-10}"
        done
      done
    done
    ;;
  generate)
    # HF --hf-compile (static cache) only on the suite's fixed shapes: on LAMBADA every batch
    # has its own padded length, and each new length recompiles (#22).
    for m in ${GEN_MODELS:-gpt2 bloom-560m}; do
      for e in ${GEN_ENGINES:-candle hf}; do
        gen_run $e $m 16 --mode generate --data .gpu/lambada_test.jsonl --limit "$GEN_LIMIT"
        gen_run $e $m 1 --mode generate --data .gpu/lambada_test.jsonl --limit "${GEN_B1_LIMIT:-200}"
      done
      for e in ${GEN_SUITE_ENGINES:-candle hf hf-compile}; do
        for bs in 1 16; do
          gen_run $e $m $bs --suite generation --prompt-lens 128 --new-tokens 128 --limit "${GEN_CALLS:-10}"
        done
      done
    done
    ;;
  dp)
    m=${DP_MODEL:-gpt2}; eq=${DP_EQ_STEPS:-10}; steps=$(( ${DP_STEPS:-50} + 3 ))
    for n in ${DP_SIZES:-2}; do
      [ "$eq" = 0 ] && break  # DP_EQ_STEPS=0: scaling runs only
      dp_run "$m" fp32 --no-dropout --warmup 0 --max-steps "$eq" --grad-accum "$n"
      dp_run "$m" fp32 --no-dropout --warmup 0 --max-steps "$eq" --dp "$n"
    done
    dp_run "$m" bf16 --warmup 3 --max-steps "$steps"
    for n in ${DP_SIZES:-2}; do
      dp_run "$m" bf16 --warmup 3 --max-steps "$steps" --dp "$n"
      case " ${DP_ZERO_SIZES:-${DP_SIZES:-2}} " in *" $n "*)
        dp_run "$m" bf16 --warmup 3 --max-steps "$steps" --dp "$n" --zero 1 ;;
      esac
    done
    # The tables come from the logs on a report build: extract-metrics --table dp-report -i DIR.
    echo "tables: unpack dp-logs.tgz, then extract-metrics --table dp-report -i dp-logs" | tee -a "$OUT/dp.txt"
    ;;
  dp-ab)
    # The previous binary (.gpu/bench-before) and this one, alternating, in one call: gpt2 bf16
    # dp 1 and dp 2 ($DP_STEPS timed steps), without dropout (the fused attention) and with it.
    unpack bench-before /tmp/bench-before || { echo "no .gpu/bench-before.{xz,gz}" >&2; exit 1; }
    steps=$(( ${DP_STEPS:-50} + 3 ))
    for drop in off on; do
      f=(); [ "$drop" = off ] && f=(--no-dropout)
      for bin in /tmp/bench-before $B; do
        B=$bin dp_run gpt2 bf16 --warmup 3 --max-steps "$steps" "${f[@]}"
        B=$bin dp_run gpt2 bf16 --warmup 3 --max-steps "$steps" "${f[@]}" --dp 2
      done
    done
    ;;
  dp-ctas)
    # gpt2 bf16 without dropout, $DP_STEPS timed steps: dp 1 and dp 2, then dp 2 --dp-overlap
    # with NCCL's blocks capped at each of $DP_CTAS (NCCL_MAX_CTAS; auto: NCCL's own choice).
    steps=$(( ${DP_STEPS:-50} + 3 ))
    dp_run gpt2 bf16 --warmup 3 --max-steps "$steps" --no-dropout
    dp_run gpt2 bf16 --warmup 3 --max-steps "$steps" --no-dropout --dp 2
    for c in ${DP_CTAS:-auto 16 8 4 2}; do
      echo "NCCL_MAX_CTAS=$c" | tee -a "$OUT/dp.txt"
      if [ "$c" = auto ]; then
        dp_run gpt2 bf16 --warmup 3 --max-steps "$steps" --no-dropout --dp 2 --dp-overlap
      else
        NCCL_MAX_CTAS=$c dp_run gpt2 bf16 --warmup 3 --max-steps "$steps" --no-dropout --dp 2 --dp-overlap
      fi
    done
    ;;
  perf-profile)
    L="--suite lambada --data .gpu/lambada_test.jsonl $ONE_PASS"
    W="--suite wikitext2 --data .gpu/wikitext-2-raw --batch-size 8 --block-size 1024 --warmup 1 --max-steps 3"
    for e in ${PROF_ENGINES:-candle hf}; do
      for c in ${PROF_CASES:-gpt2-bs16 gpt2-bs1 bloom-560m-bs16 bloom-7b1-bs16 train-gpt2}; do
        case $c in
        gpt2-bs16) profile $c-$e 10 $L --engine $e --model gpt2 --batch-size 16 --limit 400 ;;
        gpt2-bs1) profile $c-$e 20 $L --engine $e --model gpt2 --batch-size 1 --limit 40 ;;
        bloom-560m-bs16) profile $c-$e 10 $L --engine $e --model bloom-560m --batch-size 16 --limit 400 ;;
        bloom-7b1-bs16) profile $c-$e 6 $L --engine $e --model bloom-7b1 --batch-size 16 --limit 160 ;;
        train-gpt2) profile $c-$e 2 $W --engine $e --model gpt2 ${PROF_FLAGS:-} ;;
        # The larger GPT-2s' step; HF compiled (Trainer's torch_compile), its best for #36.
        train-gpt2-medium | train-gpt2-large)
          hf=(); [ "$e" = hf ] && hf=(--hf-compile)
          profile $c-$e 2 $W --engine $e --model "${c#train-}" "${hf[@]}" ${PROF_FLAGS:-} ;;
        esac
      done
    done
    python3 scripts/kernel_breakdown.py /tmp/prof/*.csv | tee "$OUT/perf-profile.txt"
    (cd /tmp && tar czf "$OUT/perf-profile.tgz" prof)
    ;;
  decode-ncu)
    # ncu's sections (throughput, occupancy, warp stalls) for two decode steps' attention and
    # add + layer norm kernels, graphed, $DECODE_NCU_MODEL (bloom-560m) batch 1, prompt 128
    # -> decode-ncu.txt
    for k in tb_decode_attention tb_add_layer_norm; do
      TB_CUDA_PROFILE=2 ncu --profile-from-start off --clock-control none --target-processes all \
        -k regex:$k --launch-skip 120 --launch-count 2 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
        $B --suite generation --prompt-lens 128 --new-tokens 16 --batch-size 1 --limit 1 $ONE_PASS \
        --model "${DECODE_NCU_MODEL:-bloom-560m}" --weights random --seed 0 --device cuda --dtype bf16 \
        --log-dir /tmp/prof-logs --no-progress >> "$OUT/decode-ncu.txt" 2>&1
      echo "decode-ncu $k: exit $?"
    done
    ;;
  gemv-ncu)
    # ncu's sections (throughput, pipes, stalls, instruction mix) for one layer's four decode GEMVs,
    # $GEMV_NCU_MODEL (bloom-7b1) batch 1, graphed, at each dtype of $GEMV_NCU_DTYPES (fp8 bf16);
    # the fp8 kernel's SASS from the host's nvcc                   -> gemv-ncu.txt, gemv-sass.txt
    for dt in ${GEMV_NCU_DTYPES:-fp8 bf16}; do
      k=tb_gemv_fp8_1_; [ "$dt" = fp8 ] || k=tb_gemv1_
      TB_CUDA_PROFILE=2 ncu --profile-from-start off --clock-control none --target-processes all \
        -k regex:$k --launch-skip 240 --launch-count 4 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats \
        $B --suite generation --prompt-lens 128 --new-tokens 16 --batch-size 1 --limit 1 $ONE_PASS \
        --model "${GEMV_NCU_MODEL:-bloom-7b1}" --weights random --seed 0 --device cuda --dtype "$dt" \
        --log-dir /tmp/prof-logs --no-progress >> "$OUT/gemv-ncu.txt" 2>&1
      echo "gemv-ncu $dt: exit $?"
    done
    { nvcc --cubin -O3 -std=c++17 -arch=sm_90 src/kernels/fp8.cu -o /tmp/fp8.cubin &&
      cuobjdump -sass /tmp/fp8.cubin | awk '/Function : tb_gemv_fp8_1_bf16/,/Function : tb_gemv_fp8_2/'; } \
      > "$OUT/gemv-sass.txt" 2>&1
    echo "gemv-sass: exit $?"
    ;;
  flash-profile)
    # ncu's sections (throughput, occupancy, warp stalls) for the fused attention's kernels in
    # one gpt2 training step: the last layer's forward, then its backward's three -> flash-ncu.txt
    TB_CUDA_PROFILE=2 ncu --profile-from-start off --clock-control none --target-processes all \
      -k regex:tb_flash --launch-skip 11 --launch-count 4 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
      $B --suite wikitext2 --data .gpu/wikitext-2-raw --batch-size 8 --block-size 1024 --warmup 1 \
      --max-steps 3 --engine candle --model gpt2 --weights random --seed 0 --device cuda --dtype bf16 \
      --no-dropout --log-dir /tmp/prof-logs --no-progress > "$OUT/flash-ncu.txt" 2>&1
    echo "flash-profile: exit $?"
    ;;
  shakespeare)
    # The Tiny Shakespeare suite (.gpu/input.txt, llm.c's split) on gpt2 bf16, batch 8 x 1024,
    # one epoch, dropout off: candle, then compiled HF (a sweep: one process an engine) -> shakespeare.txt
    $B --suite shakespeare --model gpt2 --weights random --seed 0 --device cuda --dtype bf16 \
      --data .gpu/input.txt --block-size 1024 --batch-size 8 --no-dropout --warmup 5 \
      --engine candle,hf --hf-compile --log-dir /tmp/shakespeare-logs --no-progress 2>&1 \
      | grep -v '^  |' | tee -a "$OUT/shakespeare.txt"
    echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/shakespeare.txt"
    (cd /tmp && tar czf "$OUT/shakespeare-logs.tgz" shakespeare-logs)
    ;;
  strategies-1gpu)
    # One GPU's column of the strategy table: gpt2-xl bf16 on Tiny Shakespeare (dropout on: the
    # manual step keeps the attention probabilities), batch x recompute, each configuration a
    # sweep child, OOM recorded; $STRAT_BATCHES (4,8,16) -> strategies.txt
    $B --suite shakespeare --model gpt2-xl --weights random --seed 0 --device cuda --dtype bf16 \
      --data .gpu/input.txt --block-size 1024 --batch-sizes "${STRAT_BATCHES:-4,8,16}" \
      --recompute off,on --max-steps 5 --warmup 2 --run-timeout 150 \
      --log-dir /tmp/strategy-logs --no-progress 2>&1 | grep -v '^  |' | tee -a "$OUT/strategies.txt"
    echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/strategies.txt"
    (cd /tmp && tar czf "$OUT/strategy-logs.tgz" strategy-logs)
    ;;
  hf-parallel)
    # The HF worker's strategies (DDP, FSDP SHARD_GRAD_OP / FULL_SHARD, +- gradient checkpointing)
    # under torchrun with one process, against the plain worker -> hf-parallel.txt
    timeout 400 python3 scripts/hf_parallel_check.py 2>&1 | grep -v Warning | tee "$OUT/hf-parallel.txt"
    echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/hf-parallel.txt"
    ;;
  hf-dp-cpu)
    # bench's own launch of the HF strategies (torchrun, gloo) on CPU ranks, gpt2-tiny fp32 on the
    # Shakespeare sample: --engine hf --dp 2 at --zero 0/2/3 against one HF process with
    # --grad-accum 2 and candle's --dp 2 (TCP ranks), the same blocks -> hf-dp-cpu.txt
    T=(--suite shakespeare --model gpt2-tiny --weights random --seed 0 --device cpu --dtype fp32
       --max-steps 4 --block-size 32 --batch-size 2 --no-dropout --warmup 1 --no-progress)
    rm -rf /tmp/hfdp-logs
    for z in 0 2 3; do
      $B "${T[@]}" --engine hf --dp 2 --zero $z --log-dir /tmp/hfdp-logs/hf-dp2-zero$z 2>&1 | grep -v "Loading weights\|loss_type\|^\[transformers\]" | tail -30 | tee -a "$OUT/hf-dp-cpu.txt"
    done
    $B "${T[@]}" --engine hf --grad-accum 2 --log-dir /tmp/hfdp-logs/hf-accum2 2>&1 | tail -3 | tee -a "$OUT/hf-dp-cpu.txt"
    $B "${T[@]}" --engine candle --dp 2 --log-dir /tmp/hfdp-logs/candle-dp2 2>&1 | tail -3 | tee -a "$OUT/hf-dp-cpu.txt"
    python3 - <<'PY' 2>&1 | tee -a "$OUT/hf-dp-cpu.txt"
import glob, json
for d in sorted(glob.glob("/tmp/hfdp-logs/*")):
    for f in glob.glob(d + "/*.jsonl"):
        recs = [json.loads(l) for l in open(f)]
        steps = [r["loss"] for r in recs if r.get("record") == "step"]
        dp = recs[0].get("dp") or {}
        print(d.split("/")[-1], dp.get("backend"), [round(x, 6) for x in steps])
PY
    (cd /tmp && tar czf "$OUT/hfdp-logs.tgz" hfdp-logs)
    ;;
  criterion)
    # benches/fused_kernels.rs: the fused kernels against candle's composed ops (criterion),
    # from .gpu/fused_kernels.xz (`cargo bench --no-default-features --features cuda --bench
    # fused_kernels --no-run`, stripped) -> criterion.txt
    unpack fused_kernels /tmp/fused_kernels || { echo "no .gpu/fused_kernels.{xz,gz}" >&2; exit 1; }
    (cd /tmp && ./fused_kernels --bench) 2>&1 | tee "$OUT/criterion.txt"
    ;;
  kernels)
    unpack tests /tmp/unit-tests
    # One test at a time: with parallel threads the binary hung once (results/h100/generate-run5).
    # shellcheck disable=SC2086  # several filters
    /tmp/unit-tests ${KERNEL_FILTER:-kernels:: dist:: gpu_tests::} --test-threads 1 2>&1 | tee "$OUT/kernels.txt"
    ;;
  perf-compare)
    E=${PERF_ENGINE:-both}
    L="--suite lambada --engine $E --data .gpu/lambada_test.jsonl ${PERF_FLAGS:-}"
    for c in ${PERF_CASES:-gpt2-bs16 gpt2-bs1 bloom-560m-bs16 bloom-7b1-bs16 train-gpt2}; do
      case $c in
      gpt2-bs16) perf_run $L --model gpt2 --batch-size 16 ;;
      gpt2-bs1) perf_run $L --model gpt2 --batch-size 1 --limit "$B1_LIMIT" ;;
      bloom-560m-bs16) perf_run $L --model bloom-560m --batch-size 16 ;;
      bloom-7b1-bs16) perf_run $L --model bloom-7b1 --batch-size 16 ;;
      train-gpt2) perf_run --suite wikitext2 --engine $E --model gpt2 --data .gpu/wikitext-2-raw --batch-size 8 \
        --block-size 1024 --warmup 3 --max-steps $(( ${PERF_STEPS:-50} + 3 )) --phase-times ${PERF_FLAGS:-} ;;
      esac
    done
    ;;
  multi-smoke)
    unpack tests /tmp/unit-tests || { echo "no .gpu/tests.{xz,gz}: the CUDA unit-test binary" >&2; exit 1; }
    B=$B bash scripts/multi_smoke.sh || exit 1
    ;;
  fp8)
    B=$B bash scripts/fp8_measure.sh
    ;;
  serving)
    B=$B bash scripts/serving_measure.sh
    ;;
  multi-tp|multi-tp-decode|multi-dp|multi-strategies)
    B=$B bash scripts/multi_measure.sh "${stage#multi-}"
    ;;
  fixtures)
    $FIX --out "$OUT/fixtures" --device cpu --dtype fp32 \
      --configs gpt2-fixture,gpt2-fixture-logits,bloom-fixture,bloom-fixture-logits 2>&1 | grep -v Writing
    (cd "$OUT" && tar czf fixtures.tgz fixtures && rm -rf fixtures)
    ;;
  train-grads)
    # First-step gradients of every parameter (HF, CPU fp32) from the shipped train fixtures'
    # weights and batches: tests/fixtures/train-{gpt2,bloom}/grads.safetensors
    python3 scripts/hf_fixtures/make_train_fixtures.py --out tests/fixtures --grads-only 2>&1 | tee "$OUT/train-grads.txt"
    tar czf "$OUT/train-grads.tgz" tests/fixtures/train-gpt2/grads.safetensors tests/fixtures/train-bloom/grads.safetensors
    ;;
  train-fixtures)
    python3 scripts/hf_fixtures/make_train_fixtures.py --out "$OUT/train-fixtures" --archs gpt2,bloom 2>&1 | grep -v Writing
    rm -f "$OUT"/train-fixtures/*/generation_config.json
    (cd "$OUT/train-fixtures" && tar czf "$OUT/train-fixtures.tgz" train-gpt2 train-bloom) && rm -rf "$OUT/train-fixtures"
    ;;
  wikitext2)
    [ -n "${SKIP_AGREE:-}" ] || train_run gpt2 fp32 --no-dropout --warmup 1 --max-steps 2  # first-step loss agreement
    for dt in ${DTYPES:-fp32 tf32 bf16}; do train gpt2 $dt; done
    ;;
  numerics)
    # Same seed, so the same weights in both precisions; ours in the same precision as HF,
    # and ours-bf16 against HF-fp32.
    for m in gpt2 bloom-560m; do
      for dt in fp32 bf16; do
        $FIX --out /tmp/ref-$dt --configs $m --device cuda --dtype $dt --n-passages 100 2>&1 | grep -v Writing
      done
      {
        $B verify --model-dir /tmp/ref-fp32/$m --device cuda --dtype fp32
        $B verify --model-dir /tmp/ref-bf16/$m --device cuda --dtype bf16
        echo "# ours in bf16 against the HF fp32 reference:"
        $B verify --model-dir /tmp/ref-fp32/$m --device cuda --dtype bf16
      } 2>&1 | tee -a "$OUT/verify.txt"
      rm -rf /tmp/ref-fp32/$m /tmp/ref-bf16/$m
    done
    ;;
  lambada-small)
    for dt in fp32 tf32 bf16 fp16; do lambada gpt2 $dt; done
    for dt in fp32 bf16 fp16; do lambada bloom-560m $dt; done
    ;;
  lambada-7b1)
    # Long runs: logs straight into $OUT, so a run cut off by the time limit keeps the others.
    LOGS=$OUT/logs
    lambada bloom-7b1 bf16 --save-weights /tmp/bloom-7b1-bf16
    # Checkpoint path: 14 GB of bf16 safetensors, memory-mapped, moved tensor by tensor.
    $B --model-dir /tmp/bloom-7b1-bf16 --device cuda --dtype bf16 --data .gpu/lambada_test.jsonl \
      --limit 320 --log-dir $LOGS --no-progress 2>&1 | tee -a "$OUT/lambada.txt"
    lambada bloom-7b1 fp16
    lambada bloom-7b1 fp32
    ;;
  env)
    $B env 2>&1 | tee "$OUT/env.txt"; echo "bench env exit ${PIPESTATUS[0]}" | tee -a "$OUT/env.txt"
    $B env --json > "$OUT/env.json"
    n=$(nvidia-smi -L | wc -l)
    for ((d = 0; d < n; d++)); do
      $B env --check-trackers --device cuda:$d 2>&1 | tee -a "$OUT/trackers.txt"
    done
    $B --model gpt2 --weights random --seed 0 --device cuda --dtype bf16 --batch-size 16 \
      --data .gpu/lambada_test.jsonl --limit 1000 --log-dir /tmp/env-logs --no-progress 2>&1 | tee -a "$OUT/trackers.txt"
    cp "$(ls -t /tmp/env-logs/*.jsonl | head -1)" "$OUT/env-run.jsonl"
    python3 - "$OUT/env-run.jsonl" <<'PY' 2>&1 | tee -a "$OUT/trackers.txt"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
h, s = lines[0], lines[-1]
want = ["nvml_peak_process_memory_bytes", "pool_reserved_bytes", "sm_clock_mhz_median",
        "gpu_utilization_percent_median", "power_watts_mean", "energy_joules", "joules_per_sample",
        "model_flops", "achieved_tflop_per_second", "peak_tflop_per_second", "mfu"]
print("header gpu_index", h.get("gpu_index"), "libraries", [(l["name"], l["version"]) for l in h["host"]["libraries"]])
for k in want: print(f"  {k:34} {s.get(k)}")
missing = [k for k in want if s.get(k) is None]
print("log fields:", "PASS" if not missing else f"FAIL, missing {missing}")
if s.get("energy_joules") and s.get("power_watts_mean") and s.get("energy_seconds"):
    print(f"  energy / (mean power x time) = {s['energy_joules'] / (s['power_watts_mean'] * s['energy_seconds']):.3f}")
PY
    ;;
  hf-smoke)
    $B --engine both --model gpt2-tiny --device cuda --dtype bf16 --limit 64 --log-dir /tmp/smoke \
      --no-progress 2>&1 | tee -a "$OUT/hf.txt"
    [ "${PIPESTATUS[0]}" -le 1 ] || { echo "HF smoke test failed: stopping" >&2; exit 1; }
    ;;
  hf-gpt2)
    for dt in ${DTYPES:-fp32 bf16 fp16}; do for bs in ${BATCHES:-16 1}; do
      both gpt2 $dt $bs; hf_eager gpt2 $dt $bs
    done; done
    ;;
  hf-bloom-560m)
    for dt in fp32 bf16 fp16; do both bloom-560m $dt 16; done
    for dt in fp32 bf16 fp16; do both bloom-560m $dt 1 --limit "$B1_LIMIT"; done
    ;;
  hf-bloom-7b1-16)
    for dt in ${DTYPES:-bf16 fp16 fp32}; do both bloom-7b1 $dt 16; done
    ;;
  hf-bloom-7b1-1)
    for dt in ${B1_DTYPES:-bf16 fp16 fp32}; do both bloom-7b1 $dt 1 --limit "$B1_LIMIT"; done
    ;;
  sweep-repeat)
    $B --model gpt2 --dtype bf16 --batch-size 16 --repeat 5 --weights random --seed 0 --device cuda \
      --data .gpu/lambada_test.jsonl --log-dir $SWEEPS --no-progress 2>&1 | tee -a "$OUT/sweep.txt"
    (cd $SWEEPS/.. && tar czf "$OUT/sweeps.tgz" gpu-sweeps)
    ;;
  sweep-oom)
    # First SWEEP_PASSAGES passages (default 2048: the top batch is the whole set), each run cut
    # at RUN_TIMEOUT s; RESUME=1 continues the newest sweep instead of starting over.
    resume=""; ls -d $SWEEPS/sweep_* >/dev/null 2>&1 && [ -n "${RESUME:-}" ] && resume="--resume"
    $B --model bloom-7b1 --dtype bf16 --batch-sizes ${SWEEP_BATCHES:-1,2,4,8,16,32,64,128,256,512,1024,2048} \
      $resume --run-timeout "${RUN_TIMEOUT:-150}" --limit "${SWEEP_PASSAGES:-2048}" \
      --weights random --seed 0 --device cuda --data .gpu/lambada_test.jsonl --log-dir $SWEEPS \
      --no-progress 2>&1 | grep -v '^  |' | tee -a "$OUT/sweep.txt"
    (cd $SWEEPS/.. && tar czf "$OUT/sweeps.tgz" gpu-sweeps)
    ;;
  train-compare)
    [ -x .gpu/train_gpt2cu ] || { echo ".gpu/train_gpt2cu missing: copy /work/shared/gpu/llmc/train_gpt2cu there" >&2; exit 1; }
    e=${CMP_ENGINES:-candle,hf,llmc}; compile=(); [[ $e == *hf* ]] && compile=(--hf-compile)
    LLMC_BIN=$PWD/.gpu/train_gpt2cu cmp_run --engine "$e" "${compile[@]}"
    [ "${CMP_HF_EAGER:-1}" = 1 ] && cmp_run --engine hf
    for b in ${CMP_BACKWARDS:-}; do cmp_run --engine candle --backward "$b"; done
    IFS=';' read -ra flag_sets <<< "${CMP_CANDLE_FLAGS:-}"
    for f in "${flag_sets[@]}"; do cmp_run --engine candle $f; done  # unquoted: one set, several flags
    if unpack bench-before /tmp/bench-before; then B=/tmp/bench-before cmp_run --engine candle; fi
    if unpack extract-metrics /tmp/extract-metrics; then
      /tmp/extract-metrics -i /tmp/cmp-logs -o "$OUT/train-compare.csv" --where suite=wikitext2 \
        --columns engine,model,dtype,batch_size,train_samples_per_second,tokens_per_second,peak_memory_bytes,mfu,step_latency_ms_p50,warmup_runtime,train_loss,eval_loss,status
      cat "$OUT/train-compare.csv"
    else
      echo "no .gpu/extract-metrics.{xz,gz}: unpack train-compare-logs.tgz, then extract-metrics -i cmp-logs -o train-compare.csv" | tee -a "$OUT/train-compare.txt"
    fi
    ;;
  hf-trainer)
    # Real HF Trainer output (run_clm's shape) for extract-metrics' golden tests.
    mkdir -p /tmp/trainer
    python3 scripts/hf_trainer_sample.py --vocab-dir .gpu/vocab --out /tmp/trainer > "$OUT/run_clm.log" 2> "$OUT/run_clm.stderr"
    echo "trainer exit $?"
    for f in all_results.json train_results.json eval_results.json trainer_state.json; do cp /tmp/trainer/$f "$OUT/" ; done
    tail -25 "$OUT/run_clm.log"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
if [ -n "$(ls /tmp/logs)" ]; then (cd /tmp && tar czf "$OUT/logs.tgz" logs); fi
exit 0
