# gate-run36 (#37): b32a566, `early-weights` (one-row bf16 GEMV fixed), `gemv-head` and `trigger-first` in all:
# multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times the generation
# suite 128 + 128 at batch 1: Q every path (the default), N every path but trigger-first, R every
# path but early-weights, S every path but early-weights, gemv-head and trigger-first (0da8b4d's
# kernels), D 0da8b4d's binary; bloom-7b1 Q N R S D D S R N Q, gpt2 Q N S S N Q (gemv-head does not
# apply); GPU 0 after the tests: bloom-7b1 fp8 Q N R R N Q, bloom-560m Q N S S N Q
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-0da8b4d; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
BASE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
BASE=$BASE,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label model bs dtype
  local g=$1 label=$2 m=$3 b=$4 d=$5 bin=/tmp/ab-bench flags=()
  case $label in
  Q*) ;;
  N*) flags=(--fused $BASE,early-weights,gemv-head) ;;
  R*) flags=(--fused $BASE,gemv-head,trigger-first) ;;
  S*) flags=(--fused $BASE) ;;
  D*) bin=/tmp/ab-bench-0da8b4d ;;
  esac
  echo "== $label $m bs$b $d" >> $OUT/ab-gpu$g.txt
  CUDA_VISIBLE_DEVICES=$g timeout 150 $bin --model $m --batch-size $b --dtype $d $G "${flags[@]}" --log-dir /tmp/logs/$label-$m-bs$b-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$g.txt
}
runs() { local g=$1 m=$2 b=$3 d=$4; shift 4; for l in "$@"; do one $g $l $m $b $d; done; }
gpu1() {
  runs 1 bloom-7b1 1 bf16 Q1 N1 R1 S1 D1 D2 S2 R2 N2 Q2
  runs 1 gpt2 1 bf16 Q1 N1 S1 S2 N2 Q2
}
gpu0() {
  CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
  runs 0 bloom-7b1 1 fp8 Q1 N1 R1 R2 N2 Q2
  runs 0 bloom-560m 1 bf16 Q1 N1 S1 S2 N2 Q2
}
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
for g in 1 0; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9}'; done
