# fp8 GEMV block shapes (TB_FP8_SWEEP, one row): bloom-7b1 fp8 batch 1, generation suite
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench.xz"),open("/tmp/bench","wb"))'; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress"
for v in default c2s4 c4s8 default c4s2 c2s8 c8s8 c1s4 default; do
  for m in bloom-7b1; do
    echo "== $v $m" | tee -a $OUT/sweep.txt
    if [ $v = default ]; then unset TB_FP8_SWEEP; else export TB_FP8_SWEEP=$v; fi
    timeout 60 /tmp/bench --engine candle --model $m --batch-size 1 --dtype fp8 $G --log-dir /tmp/sweep-logs/$v 2>&1 | grep -E "inter-token|rror" | tee -a $OUT/sweep.txt
  done
done
unset TB_FP8_SWEEP
for v in default c2s4 c4s8; do
  echo "== $v bloom-560m" | tee -a $OUT/sweep.txt
  if [ $v = default ]; then unset TB_FP8_SWEEP; else export TB_FP8_SWEEP=$v; fi
  timeout 60 /tmp/bench --engine candle --model bloom-560m --batch-size 1 --dtype fp8 $G --log-dir /tmp/sweep-logs/560-$v 2>&1 | grep -E "inter-token|rror" | tee -a $OUT/sweep.txt
done
(cd /tmp && tar czf $OUT/sweep-logs.tgz sweep-logs)
