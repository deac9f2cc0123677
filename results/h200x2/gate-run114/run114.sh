# gate-run114 (#37): 5aea2d4 (branch cf-tf, to be submitted if faster: with `--fused
# trigger-first` the cache-first attention lets the next kernel, the output projection, launch
# before its own loads (tb_decode_attention_cf<CS>_h<HS>_tf), instead of after its wait) on a
# two-GPU host: multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times
# the generation suite 128 + 128, bf16, batch 1, inter-token p50: W every path (all) on 5aea2d4,
# P every path on 5216d27 (cache-first, the attention letting the next kernel launch after its
# wait), N 5aea2d4 without trigger-first (its attention as P's, the final norm waiting first
# too); bloom-560m and gpt2 W P P W N, gpt2-medium and bloom-1b7 W P, and W traced.
# Why (gate-run113's trace): with cache-first the attention ended 0.2 us sooner after its wait,
# but the MLP's first GEMV (8.4 MB, launched once the output projection starts, which launches
# once the attention has waited) ended 0.5 us later: its weights have less time to arrive.
# Predicted (before the call): proj, fc, fc2 launch a stage earlier, fc's end_delta 3.7 -> 2.8-
# 3.2 us: bloom-560m P 0.466 -> W 0.445-0.460; gpt2 0.175 -> 0.168-0.174; gpt2-medium 0.373 ->
# 0.355-0.368; bloom-1b7 1.183 -> 1.165-1.180. A risk: kernels resident further ahead take
# the SMs' registers from the ones that run.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/main.xz /tmp/main; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/bench /tmp/main
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOTF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,norm-fold,cluster,step-io,norm-stats,skinny-fold,gemv-wide,cache-first
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all b=/tmp/bench limit=10 env=""
  case $label in N*) f=$NOTF ;; P*) b=/tmp/main ;; T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 env $env timeout 150 $b --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv > $OUT/timeline.txt 2>&1; fi; }
mkdir -p /tmp/tr
gpu1() { for l in W1 P1 P2 W2 N1; do one $l bloom-560m; done; for l in W1 P1 P2 W2 N1; do one $l gpt2; done
  for l in W1 P1; do one $l gpt2-medium; done; for l in W1 P1; do one $l bloom-1b7; done; one T1 bloom-560m; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
sed -n 1,25p $OUT/timeline.txt
