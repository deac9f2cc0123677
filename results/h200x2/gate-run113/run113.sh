# gate-run113 (#37): 5216d27 (branch cache-first, to be submitted: `--fused cache-first`, the
# one-row cluster attention reads the cursor, its cached keys and values, the mask and the key
# positions before it waits for the qkv projection, and only q and the new key and value after)
# on a two-GPU host: multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1
# times the generation suite 128 + 128, bf16, batch 1, inter-token p50: W every path (all) on
# 5216d27, C the same binary without cache-first, M main's b4df0b9 (every path); bloom-560m and
# gpt2 W C C W M, gpt2-medium and bloom-1b7 (head size 128) W C, and W traced (CUPTI,
# scripts/kernel_timeline.py) for bloom-560m.
# Predicted (before the call): the attention's end_delta 4.4 -> 3.6-3.9 us (one L2 round trip
# of ~0.6-0.8 us fewer after its wait): bloom-560m C 0.467 -> W 0.447-0.457; gpt2 0.180 ->
# 0.170-0.176; gpt2-medium 0.375 -> 0.355-0.365; bloom-1b7 1.188 -> 1.170-1.182; C = M within
# 2 us (the kernels without the path are unchanged but for where the split's early return is).
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/main.xz /tmp/main; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/bench /tmp/main
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOCF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold,gemv-wide
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all b=/tmp/bench limit=10 env=""
  case $label in C*) f=$NOCF ;; M*) b=/tmp/main ;; T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 env $env timeout 150 $b --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv > $OUT/timeline.txt 2>&1; fi; }
mkdir -p /tmp/tr
gpu1() { for l in W1 C1 C2 W2 M1; do one $l bloom-560m; done; for l in W1 C1 C2 W2 M1; do one $l gpt2; done
  for l in W1 C1; do one $l gpt2-medium; done; for l in W1 C1; do one $l bloom-1b7; done; one T1 bloom-560m; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
sed -n 1,25p $OUT/timeline.txt
