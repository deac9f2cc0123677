# gemv-norm (c48c860): its kernel tests and the models' decode tests on GPU 0, then the A/B
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
CUDA_VISIBLE_DEVICES=0 KERNEL_FILTER="gpu_tests::decode gpu_tests::fp8 gpu_tests::step" timeout 200 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|panicked|FAILED|^test .*(FAILED|ok)$" $OUT/kernels.txt | tail -20
GEN_CALLS=10 NORM_ROUNDS=1 timeout 380 bash scripts/gpu_checks.sh norm-ab > /dev/null 2>&1; echo "norm-ab exit $?"
grep -E "^---|inter-token|exit|rror" $OUT/gen.txt | grep -v "^exit 0" | head -80
