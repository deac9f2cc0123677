# gpt2 decode GEMV (prepare_decode) + step opt-in: tests, agreement with HF, A/B against 591e1cf (one call)
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 | tee $OUT/host.txt
KERNEL_FILTER="gpu_tests::step gpu_tests::decode" timeout 150 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "^test |test result|panicked" $OUT/kernels.txt | grep -v " ok$" | tail -8
grep -q "test result: ok" $OUT/kernels.txt || echo "KERNEL TESTS FAILED"
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench.xz"),open("/tmp/bench","wb"))'; chmod +x /tmp/bench
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench-before.xz"),open("/tmp/bench-before","wb"))'; chmod +x /tmp/bench-before
for bs in 1 4; do
  timeout 120 /tmp/bench --engine both --mode generate --model gpt2 --weights random --seed 0 --device cuda --dtype fp32 \
    --batch-size $bs --data .gpu/lambada_test.jsonl --limit 64 --hf-attn eager --log-dir /tmp/agree-logs --no-progress > $OUT/agree-bs$bs.txt 2>&1
  echo "agree bs$bs exit $?"; grep -iE "identical|agree|ids" $OUT/agree-bs$bs.txt | head -4
done
NO_STEP=$(grep -o "^NO_STEP=.*" scripts/gpu_checks.sh | head -3 | sed 's/NO_STEP=\$NO_STEP,//; s/NO_STEP=//' | paste -sd,)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --dtype bf16 --no-progress"
for r in 1 2; do for m in gpt2 bloom-560m; do for bs in 1 4 16; do
  [ $m = bloom-560m ] && [ $bs = 16 ] && continue
  for b in before after; do
    bin=/tmp/bench; [ $b = before ] && bin=/tmp/bench-before
    echo "== $b $m bs$bs r$r"; timeout 60 $bin --engine candle --fused $NO_STEP --model $m --batch-size $bs $G --log-dir /tmp/ab-logs/$b 2>&1 | grep -E "inter-token|decode tokens"
  done
done; done; done
for b in before after; do
  bin=/tmp/bench; [ $b = before ] && bin=/tmp/bench-before
  echo "== scoring $b gpt2 bs16"; timeout 90 $bin --engine candle --fused $NO_STEP --suite lambada --model gpt2 --batch-size 16 --data .gpu/lambada_test.jsonl --weights random --seed 0 --device cuda --dtype bf16 --no-progress --log-dir /tmp/ab-logs/score-$b 2>&1 | grep -E "samples/s|accuracy"
done
(cd /tmp && tar czf $OUT/ab-logs.tgz ab-logs agree-logs)
