# skinny-run3 (5fc19c6): kernels' tests on GPU 0, then batch-8 and batch-1 A/B there; GPU 1: batch-16
# with / without skinny-proj (same binary), fp8, and the tile sweep (TB_SKINNY_NT)
export NCCL_NVLS_ENABLE=0
for b in bench bench-before; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
OFF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
OFF=$OFF,residual,gemv,skinny,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label binary model bs dtype [flags]
  local gpu=$1 label=$2 bin=$3 m=$4 bs=$5 d=$6; shift 6
  echo "== $label $m bs$bs $d" >> $OUT/ab-gpu$gpu.txt
  CUDA_VISIBLE_DEVICES=$gpu timeout 120 /tmp/ab-$bin --model $m --batch-size $bs --dtype $d $G "$@" \
    --log-dir /tmp/logs/$label-$m-bs$bs-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$gpu.txt
}
on() { one "$1" on bench "${@:2}"; }
off() { one "$1" off bench "${@:2}" --fused "$OFF"; }
gpu1() {
  for c in bloom-560m:16 gpt2:16; do IFS=: read m b <<< "$c"
    off 1 $m $b bf16; on 1 $m $b bf16; on 1 $m $b bf16; off 1 $m $b bf16; done
  off 1 bloom-7b1 16 bf16; on 1 bloom-7b1 16 bf16
  on 1 bloom-7b1 16 fp8; off 1 bloom-7b1 16 fp8
  for nt in 1 2; do
    TB_SKINNY_NT=$nt one 1 nt$nt bench bloom-560m 16 bf16
    TB_SKINNY_NT=$nt one 1 nt$nt bench bloom-7b1 16 bf16
  done
  TB_SKINNY_NT=2 one 1 nt2 bench gpt2 16 bf16
}
gpu0() {
  CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
  for m in gpt2 bloom-560m; do off 0 $m 8 bf16; on 0 $m 8 bf16; done
  one 0 before bench-before gpt2 16 bf16; on 0 gpt2 16 bf16
  one 0 before bench-before gpt2 1 bf16; on 0 gpt2 1 bf16
}
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
for g in 1 0; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9,$10,$11}'; done
