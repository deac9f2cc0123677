# gate-run118 (#37): 6972711 (to be submitted: `--fused head-pick` as in gate-run117, but each
# head block's key goes into slot blockIdx % 32 of 32 words 256 bytes apart, and tb_argmax_key
# takes the best of the 32 with one warp) on a two-GPU host, as gate-run117: multi-smoke, the
# kernels' GPU tests on GPU 0, GPU 1 W (all) against P (the same binary without head-pick),
# then W traced for bloom-560m and gpt2.
# gate-run117 (one word for every block): the head 12 us slower on bloom-560m (132.1 against
# 120.4 in gate-run113's trace; 15680 reductions of one address, about 0.75 ns each) and 3 on
# gpt2 (3142 blocks), the pick after it 1.06 us instead of 6.24 / 5.54: W 0.473 against P 0.466,
# gpt2 0.174 against 0.176.
# Predicted (before the call): the head's end_delta back within 1 us of the plain head's (120.4
# bloom-560m, 22.6 gpt2), tb_argmax_key 1.1-1.5 us; bloom-560m P 0.466 -> W 0.460-0.463; gpt2
# 0.176 -> 0.170-0.172; gpt2-medium 0.375 -> 0.369-0.372; bloom-1b7 W = P within 1 us.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOHP=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold,gemv-wide,cache-first
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all limit=10 env=""
  case $label in P*) f=$NOHP ;; T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 env $env timeout 150 /tmp/bench --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
gpu1() { for l in W1 P1 P2 W2; do one $l bloom-560m; done; for l in W1 P1 P2 W2; do one $l gpt2; done
  for l in W1 P1; do one $l gpt2-medium; done; for l in W1 P1; do one $l bloom-1b7; done
  one T1 bloom-560m; one T1 gpt2; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
grep -E "^####|step span|between steps|tb_skinny_head|tb_argmax|tb_embed|tb_decode_begin" $OUT/timelines.txt | head -40
