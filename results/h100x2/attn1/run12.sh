# attn1: kernels' GPU tests (GPU 0), then before/after A/B of the decode attention (GPU 1: batch 1; GPU 0: batch 16)
export NCCL_NVLS_ENABLE=0
for b in bench bench-before; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # file gpu binary model bs dtype
  local t0=$(date +%s.%N)
  echo "== $3 $4 bs$5 $6" >> $OUT/$1
  CUDA_VISIBLE_DEVICES=$2 timeout 60 /tmp/ab-$3 --model $4 --batch-size $5 --dtype $6 $G --log-dir /tmp/logs/$3-$4-bs$5-$6 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/$1
  echo "   wall $(awk "BEGIN{print $(date +%s.%N) - $t0}")" >> $OUT/$1
}
ab() { # file gpu then list of model:bs:dtype
  local f=$1 g=$2; shift 2
  for c in "$@"; do IFS=: read m b d <<< "$c"; one $f $g bench-before $m $b $d; one $f $g bench $m $b $d; done
  for c in "$@"; do IFS=: read m b d <<< "$c"; one $f $g bench $m $b $d; one $f $g bench-before $m $b $d; done
}
( CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
  ab ab-bs16.txt 0 gpt2:16:bf16 bloom-560m:16:bf16 bloom-7b1:16:bf16 ) &
ab ab-bs1.txt 1 gpt2:1:bf16 bloom-560m:1:bf16 bloom-7b1:1:bf16 bloom-7b1:1:fp8 &
wait
(cd /tmp && tar czf $OUT/logs.tgz logs)
grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head -20
cat $OUT/ab-bs1.txt $OUT/ab-bs16.txt | paste - - - | awk '{print $2,$3,$4,$5,$9,$16}'
