# gate-run117 (#37): d5d7b03 (to be submitted: `--fused head-pick`, the one-row LM head's blocks
# each reduce their 16 columns to one 64-bit key (the logit as stored, plus the ban; the first
# index among equals) and red.max it into one word; tb_argmax_key, one thread, then writes the
# ids and the record and resets the word, instead of the head writing the logits and
# tb_argmax_part_last reading them back) on a two-GPU host: multi-smoke (both GPUs), then the
# kernels' GPU tests on GPU 0 while GPU 1 times the generation suite 128 + 128, bf16, batch 1,
# inter-token p50: W every path (all) on d5d7b03, P the same binary without head-pick;
# bloom-560m and gpt2 W P P W, gpt2-medium and bloom-1b7 W P (bloom-1b7's 4 KB head rows take
# cuBLAS: the path does not apply, a control), then W traced (CUPTI, scripts/kernel_timeline.py)
# for bloom-560m and gpt2.
# Predicted (before the call): after the head, tb_argmax_part_last's 6.24 us (bloom-560m; 5.54
# gpt2: its wait, the logits' reload, a count, the chunks' reduction) becomes tb_argmax_key's
# 2.0-2.5 (its wait, one atomic exchange beside the cursor's load, two stores); the head itself
# within +-1 us (its mainloop's SASS is the plain head's: 8 weight loads before the first mma,
# 110 registers). bloom-560m P 0.466 -> W 0.461-0.464; gpt2 0.175 -> 0.170-0.173; gpt2-medium
# 0.373 -> 0.368-0.371; bloom-1b7 W = P within 1 us.
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
