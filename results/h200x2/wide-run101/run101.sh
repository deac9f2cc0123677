# wide-run101 (#37): 2ecb676 (branch gemv-wide: `--fused gemv-wide`, one-row decode GEMVs as one
# wave of 8-warp blocks whose weight vectors load before the wait) on a two-GPU host: multi-smoke
# (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times the generation suite
# 128 + 128, bf16, batch 1, inter-token p50: W every path (all), O every path but gemv-wide (the
# same binary); bloom-560m W O O W, gpt2 W O O W.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOWIDE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all
  case $label in O*) f=$NOWIDE ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 timeout 120 /tmp/bench --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|fused" >> $OUT/ab.txt; }
gpu1() { for l in W1 O1 O2 W2; do one $l bloom-560m; done; for l in W1 O1 O2 W2; do one $l gpt2; done; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
