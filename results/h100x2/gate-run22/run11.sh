# adf17ab, the final binaries: the kernels' GPU tests on GPU 0, multi-smoke on both (one call)
export NCCL_NVLS_ENABLE=0
CUDA_VISIBLE_DEVICES=0 timeout 140 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|panicked|FAILED|fp8_gemv" $OUT/kernels.txt | tail -6
grep -q "test result: ok" $OUT/kernels.txt && echo "KERNELS PASSED" || echo "KERNELS FAILED"
timeout 110 bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1; echo "multi-smoke exit $?"
tail -2 $OUT/multi-smoke.txt
