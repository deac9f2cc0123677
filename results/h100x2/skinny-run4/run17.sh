# skinny-run4 (a5f6c04, exp-skinny): the skinny kernel's six variants (TB_SKINNY_V) at batch 16 (bf16, fp8)
# and gpt2's head at batch 1, against the same binary without skinny-proj and a7663d0 (before);
# variants 0-2 on GPU 0, 3-5 on GPU 1, baselines on both
export NCCL_NVLS_ENABLE=0
for b in bench-exp bench-before; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
OFF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
OFF=$OFF,residual,gemv,skinny,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label binary model bs dtype [flags]
  local gpu=$1 label=$2 bin=$3 m=$4 bs=$5 d=$6; shift 6
  echo "== $label $m bs$bs $d" >> $OUT/ab-gpu$gpu.txt
  CUDA_VISIBLE_DEVICES=$gpu timeout 120 /tmp/ab-$bin --model $m --batch-size $bs --dtype $d $G "$@" \
    --log-dir /tmp/logs/$label-$m-bs$bs-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$gpu.txt
}
base() { # gpu
  one $1 off bench-exp bloom-560m 16 bf16 --fused "$OFF"; one $1 off bench-exp gpt2 16 bf16 --fused "$OFF"
  one $1 off bench-exp bloom-7b1 16 bf16 --fused "$OFF"; one $1 before bench-before gpt2 1 bf16
}
variants() { # gpu v...
  local gpu=$1; shift
  for v in "$@"; do
    for c in bloom-560m:16:bf16 gpt2:16:bf16 bloom-7b1:16:bf16 bloom-7b1:16:fp8 gpt2:1:bf16; do IFS=: read m b d <<< "$c"
      TB_SKINNY_V=$v one $gpu v$v bench-exp $m $b $d; done
    TB_SKINNY_V=$v TB_SKINNY_NT=2 one $gpu v$v-nt2 bench-exp bloom-560m 16 bf16
  done
}
(base 0; variants 0 0 1 2; base 0) & (base 1; variants 1 3 4 5; base 1) & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
for g in 0 1; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9}'; done
