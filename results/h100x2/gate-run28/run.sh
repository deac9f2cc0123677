# gate-run28 / ft-run1: 07544ed (generation's prefill packed). multi-smoke (both GPUs) first; then
# the kernels' GPU tests on GPU 0 while GPU 1 runs LAMBADA --mode generate, batch 16, with the
# packed prefill (--fused all) and without (every path but prefill), A B A, then candle against
# HF's best (scripts/hf_remeasure.sh ft:...) for the three models
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
OFF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
OFF=$OFF,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,push-sum,copy-sum,adamw-copies,ln-residual,flash-dq
F="--suite lambada --mode generate --data .gpu/lambada_test.jsonl --batch-size 16 --weights random --seed 0 --device cuda --dtype bf16 --no-progress --engine candle"
one() { # label model limit [flags]
  local label=$1 m=$2 n=$3; shift 3
  echo "== $label $m" >> $OUT/ab-gpu1.txt
  CUDA_VISIBLE_DEVICES=1 timeout 150 /tmp/bench --model $m --limit $n $F "$@" --log-dir /tmp/logs/$label-$m 2>&1 \
    | grep -E "samples/s|batch latency|rror|panic" >> $OUT/ab-gpu1.txt
}
gpu1() {
  for c in bloom-7b1:320 gpt2:640 bloom-560m:640; do IFS=: read m n <<< "$c"
    one packed $m $n; one padded $m $n --fused "$OFF"; one packed2 $m $n; done
  (cd /tmp && tar czf $OUT/ab-logs.tgz logs)
  CUDA_VISIBLE_DEVICES=1 GEN_LIMIT=320 timeout 200 bash scripts/hf_remeasure.sh ft:bloom-7b1 > /dev/null 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 150 bash scripts/hf_remeasure.sh ft:gpt2 ft:bloom-560m > /dev/null 2>&1
}
CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1 & gpu1 & wait
grep -E "test result|FAILED|panicked|failed|packed_prefill" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
cat $OUT/ab-gpu1.txt
grep -E "^---|samples/s|identical|hf ran|exit" $OUT/remeasure.txt
