# gate on the final binaries: kernels' GPU tests on GPU 0, multi-smoke on both (one call)
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/host.txt
CUDA_VISIBLE_DEVICES=0 timeout 150 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|panicked|FAILED" $OUT/kernels.txt | tail -6
grep -q "test result: ok" $OUT/kernels.txt && echo "KERNELS PASSED" || echo "KERNELS FAILED"
timeout 120 bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1; echo "multi-smoke exit $?"
tail -2 $OUT/multi-smoke.txt
