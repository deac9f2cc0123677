# gate-run29: the submitted binaries (725e569: the reviews' fixes to the packed prefill, the
# configs split): multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1
# runs LAMBADA --mode generate for gpt2 and bloom-560m with the packed prefill and without
# (every path but prefill), A B A
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
OFF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
OFF=$OFF,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,push-sum,copy-sum,adamw-copies,ln-residual,flash-dq
F="--suite lambada --mode generate --data .gpu/lambada_test.jsonl --batch-size 16 --limit 640 --weights random --seed 0 --device cuda --dtype bf16 --no-progress --engine candle"
one() { # label model [flags]
  local label=$1 m=$2; shift 2
  echo "== $label $m" >> $OUT/ab-gpu1.txt
  CUDA_VISIBLE_DEVICES=1 timeout 100 /tmp/bench --model $m $F "$@" --log-dir /tmp/logs/$label-$m 2>&1 \
    | grep -E "samples/s|batch latency|rror|panic" >> $OUT/ab-gpu1.txt
}
gpu1() { for m in gpt2 bloom-560m; do one packed $m; one padded $m --fused "$OFF"; one packed2 $m; done; }
CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed|prefill_kv|packed_prefill" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
cat $OUT/ab-gpu1.txt
