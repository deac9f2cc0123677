# gate-run23: kernels' GPU tests (GPU 0) while GPU 1 runs the batch-1 A/B (51667c7 -> this binary); then multi-smoke
export NCCL_NVLS_ENABLE=0
for b in bench bench-attn; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --batch-size 1"
one() { # label model dtype
  local t0=$(date +%s.%N)
  echo "== $1 $2 $3" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 timeout 60 /tmp/ab-$1 --model $2 --dtype $3 $G --log-dir /tmp/logs/$1-$2-$3 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab.txt
  echo "   wall $(awk "BEGIN{print $(date +%s.%N) - $t0}")" >> $OUT/ab.txt
}
ab() {
  for c in gpt2:bf16 bloom-560m:bf16 bloom-7b1:bf16 bloom-7b1:fp8; do
    IFS=: read m d <<< "$c"
    one bench-attn $m $d; one bench $m $d; one bench $m $d; one bench-attn $m $d
  done
}
CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1 &
ab &
wait
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -2 $OUT/multi-smoke.txt
cat $OUT/ab.txt | paste - - - | awk '{print $2,$3,$4,$8}'
