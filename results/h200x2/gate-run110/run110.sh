# gate-run110 (#37): 9f5d47c (branch wide-tf, to be submitted: `--fused gemv-wide` triggers the
# next kernel before its weights load and it waits, and takes the folded one-row GEMVs at K <=
# 1024, their weights now streaming loads that ptxas keeps before the wait) on a two-GPU host: multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while
# GPU 1 times the generation suite 128 + 128, bf16, batch 1, inter-token p50: W every path (all),
# O every path but gemv-wide (the same binary); bloom-560m and gpt2 W O O W, gpt2-medium and
# bloom-1b7 W O, and W traced (CUPTI, scripts/kernel_timeline.py) for bloom-560m.
# Predicted (before the call): as tf-run109's knob binary with every wide kernel triggering first
# (whose branches kept its weight loads before the wait): bloom-560m O 0.577-0.590 -> W 0.49-0.50;
# gpt2 0.222-0.234 -> 0.195-0.20; gpt2-medium 0.498 -> 0.42-0.45; bloom-1b7 (proj K 2048 the row
# kernel, now loading early) -5 to +5 us.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOWIDE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all limit=10 env=""
  case $label in O*) f=$NOWIDE ;; T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 env $env timeout 150 /tmp/bench --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv > $OUT/timeline.txt 2>&1; fi; }
mkdir -p /tmp/tr
gpu1() { for l in W1 O1 O2 W2; do one $l bloom-560m; done; for l in W1 O1 O2 W2; do one $l gpt2; done
  for l in W1 O1; do one $l gpt2-medium; done; for l in W1 O1; do one $l bloom-1b7; done; one T1 bloom-560m; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
sed -n 1,25p $OUT/timeline.txt
