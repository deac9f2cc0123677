# norm1: kernels' GPU tests (GPU 0) while GPU 1 runs the batch-1 A/B; then multi-smoke
export NCCL_NVLS_ENABLE=0
for b in bench bench-before bench-attn; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
NONORM=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq
one() { # label model args...
  local label=$1 m=$2; shift 2
  local t0=$(date +%s.%N)
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 timeout 60 "$@" --model $m $G --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab.txt
  echo "   wall $(awk "BEGIN{print $(date +%s.%N) - $t0}")" >> $OUT/ab.txt
}
ab() {
  for m in gpt2 bloom-560m bloom-7b1; do
    one before $m /tmp/ab-bench-before
    one nonorm $m /tmp/ab-bench --fused $NONORM
    one norm $m /tmp/ab-bench
    one norm $m /tmp/ab-bench
    one nonorm $m /tmp/ab-bench --fused $NONORM
    one before $m /tmp/ab-bench-before
  done
}
CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1 &
ab &
wait
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
(cd /tmp && tar czf $OUT/logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -3 $OUT/multi-smoke.txt
cat $OUT/ab.txt | paste - - - | awk '{print $2,$3,$7}'
