# d2dc14c: the gate (kernels' GPU tests on GPU 0, multi-smoke on both) and the A/B against the
# sweep binary without its variable (8dd84f1's kernels), alternating
export NCCL_NVLS_ENABLE=0
CUDA_VISIBLE_DEVICES=0 timeout 170 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|panicked|FAILED" $OUT/kernels.txt | tail -6
grep -q "test result: ok" $OUT/kernels.txt && echo "KERNELS PASSED" || echo "KERNELS FAILED"
timeout 150 bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1; echo "multi-smoke exit $?"
tail -2 $OUT/multi-smoke.txt
export CUDA_VISIBLE_DEVICES=0
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench-before.xz"),open("/tmp/bench-before","wb"))'; chmod +x /tmp/bench-before
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --dtype fp8 --no-progress"
run() { # label binary model
  echo "== $1 $3" | tee -a $OUT/ab.txt
  timeout 60 $2 --engine candle --model $3 --batch-size 1 $G --log-dir /tmp/ab-logs/$1 2>&1 | grep -E "inter-token|rror" | tee -a $OUT/ab.txt
}
for m in bloom-7b1 bloom-560m gpt2 bloom-7b1; do
  run before /tmp/bench-before $m; run after /tmp/bench $m
done
(cd /tmp && tar czf $OUT/ab-logs.tgz ab-logs)
