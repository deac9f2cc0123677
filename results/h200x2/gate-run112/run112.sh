# gate-run112 (#37): b4df0b9 (branch fc2-pair, to be submitted: gemv-wide's row kernel, K 1024 <
# K <= 4096, as two warps a column and four columns a block instead of a block a column) on a
# two-GPU host: multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times
# the generation suite 128 + 128, bf16, batch 1, inter-token p50: W every path (all) on b4df0b9,
# M every path on main's binary 9f5d47c, O b4df0b9 without gemv-wide; bloom-560m and gpt2 W M M
# W O, gpt2-medium and bloom-1b7 W M, and W traced (CUPTI, scripts/kernel_timeline.py) for
# bloom-560m.
# Predicted (before the call), from exp-run111's knob (TB_FC2_HALF, 0.485 -> 0.465): bloom-560m
# M 0.485-0.490 -> W 0.462-0.472; gpt2 0.183-0.186 -> 0.176-0.181; gpt2-medium 0.393 ->
# 0.370-0.380 (fc2 the same shape as bloom-560m's); bloom-1b7 (only proj, K 2048, takes the row
# kernel: 512 blocks instead of 2048) -5 to +2 us; O as gate-run110's O (0.591, 0.235).
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/main.xz /tmp/main; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/bench /tmp/main
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOWIDE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all b=/tmp/bench limit=10 env=""
  case $label in O*) f=$NOWIDE ;; M*) b=/tmp/main ;; T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 env $env timeout 150 $b --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv > $OUT/timeline.txt 2>&1; fi; }
mkdir -p /tmp/tr
gpu1() { for l in W1 M1 M2 W2 O1; do one $l bloom-560m; done; for l in W1 M1 M2 W2 O1; do one $l gpt2; done
  for l in W1 M1; do one $l gpt2-medium; done; for l in W1 M1; do one $l bloom-1b7; done; one T1 bloom-560m; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
sed -n 1,25p $OUT/timeline.txt
