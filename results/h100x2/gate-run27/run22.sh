# gate-run27: the final binaries (6a1bc61: the weight limit 8 MB, the review's tests):
# multi-smoke, then the kernels' GPU tests on GPU 0
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
