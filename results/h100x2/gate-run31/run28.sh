# gate-run31 (#37): 88bfdd2, `--fused pdl` at 1-4 rows (programmatic edges drawn during the capture):
# multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times the generation
# suite 128 + 128 with every path (pdl on) and with every path but pdl, A B B A; GPU 0 then
# times bloom-7b1 fp8 batch 1 the same way
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
NOPDL=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
NOPDL=$NOPDL,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label model bs dtype [flags]
  local g=$1 label=$2 m=$3 b=$4 d=$5; shift 5
  echo "== $label $m bs$b $d" >> $OUT/ab-gpu$g.txt
  CUDA_VISIBLE_DEVICES=$g timeout 150 /tmp/bench --model $m --batch-size $b --dtype $d $G "$@" --log-dir /tmp/logs/$label-$m-bs$b-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$g.txt
}
abba() { # gpu model bs dtype
  one $1 pdl $2 $3 $4; one $1 nopdl $2 $3 $4 --fused $NOPDL; one $1 nopdl2 $2 $3 $4 --fused $NOPDL; one $1 pdl2 $2 $3 $4
}
gpu1() { for c in gpt2:1:bf16 bloom-560m:1:bf16 gpt2:16:bf16 bloom-560m:16:bf16 bloom-7b1:1:bf16; do IFS=: read m b d <<< "$c"; abba 1 $m $b $d; done; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; abba 0 bloom-7b1 1 fp8; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed|programmatic|started_early" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
for g in 1 0; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9}'; done
