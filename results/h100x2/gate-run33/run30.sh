# gate-run33 (#37): 0da8b4d, pdl after the code review and gate-run32's fix (Early only inside a capture, on Hopper
# with compute-90 PTX, only allocations between begin and launch): multi-smoke (both GPUs),
# the kernels' GPU tests on GPU 0; GPU 1 meanwhile gpt2 and bloom-560m batch 1 with every
# path and with every path but pdl, A B A B
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
NOPDL=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
NOPDL=$NOPDL,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { # label model [flags]
  local label=$1 m=$2; shift 2
  echo "== $label $m bs1 bf16" >> $OUT/ab-gpu1.txt
  CUDA_VISIBLE_DEVICES=1 timeout 100 /tmp/bench --model $m $G "$@" --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|graph" >> $OUT/ab-gpu1.txt
}
gpu1() { one pdl gpt2; one nopdl gpt2 --fused $NOPDL; one pdl2 gpt2; }
CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
cat $OUT/ab-gpu1.txt
