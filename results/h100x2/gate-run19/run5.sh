# gate on the submitted binaries (kernels' GPU tests on GPU 0, multi-smoke on both) and the
# final A/B against 591e1cf (one call)
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/host.txt
CUDA_VISIBLE_DEVICES=0 timeout 170 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|panicked|FAILED" $OUT/kernels.txt | tail -6
grep -q "test result: ok" $OUT/kernels.txt && echo "KERNELS PASSED" || echo "KERNELS FAILED"
timeout 150 bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1; echo "multi-smoke exit $?"
tail -4 $OUT/multi-smoke.txt
export CUDA_VISIBLE_DEVICES=0
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench.xz"),open("/tmp/bench","wb"))'; chmod +x /tmp/bench
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench-before.xz"),open("/tmp/bench-before","wb"))'; chmod +x /tmp/bench-before
NO_STEP=$(grep -o "^NO_STEP=.*" scripts/gpu_checks.sh | head -3 | sed 's/NO_STEP=\$NO_STEP,//; s/NO_STEP=//' | paste -sd,)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --dtype bf16 --no-progress"
run() { # label binary model batch [flags]
  local l=$1 bin=$2 m=$3 bs=$4; shift 4
  echo "== $l $m bs$bs"; timeout 60 $bin --engine candle --model $m --batch-size $bs $G --log-dir /tmp/final-logs/$l "$@" 2>&1 | grep -E "inter-token"
}
for m in gpt2 bloom-560m; do for bs in 1 4 16; do
  [ $m = bloom-560m ] && [ $bs != 1 ] && continue
  run before /tmp/bench-before $m $bs --fused $NO_STEP
  run after /tmp/bench $m $bs
  [ $bs = 1 ] && run after-step /tmp/bench $m $bs --fused all,step
done; done
for b in before after; do
  bin=/tmp/bench; [ $b = before ] && bin=/tmp/bench-before
  echo "== scoring $b gpt2 bs16"; timeout 90 $bin --engine candle --fused $NO_STEP --suite lambada --model gpt2 --batch-size 16 --data .gpu/lambada_test.jsonl --weights random --seed 0 --device cuda --dtype bf16 --no-progress --log-dir /tmp/final-logs/score-$b 2>&1 | grep -E "samples/s"
done
(cd /tmp && tar czf $OUT/final-logs.tgz final-logs)
