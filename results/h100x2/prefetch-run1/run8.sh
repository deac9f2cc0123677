# l2-prefetch (766a5ee): the kernels' GPU tests on GPU 0, then the A/B
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
timeout 170 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|panicked|FAILED" $OUT/kernels.txt | tail -8
GEN_CALLS=10 timeout 400 bash scripts/gpu_checks.sh prefetch-ab > /dev/null 2>&1; echo "prefetch-ab exit $?"
grep -E "^candle|inter-token" $OUT/gen.txt | paste - - | awk '{print $5, $9, $13, $(NF-4)}'
