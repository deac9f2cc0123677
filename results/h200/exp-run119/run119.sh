# exp-run119 (#37): why the one-row head that picks (gate-run117/118: tb_skinny_head_pick) is
# 12 us slower than the plain head on bloom-560m (132.9 against ~120.4) though its mainloop's
# SASS is the plain head's. One H200, experiment binary 8ce6996 (branch hp-exp: 6972711 plus a
# knob TB_PICK_MODE for the head's last lines): 0 as submitted-to-be (warp 0's 64-bit shuffle
# reduction, one red.max into the block's slot), 1 the reduction then a plain store (wrong
# picks: timing only), 2 the reduction and no write, 3 no reduction, a red.max a lane (16 a
# block); P the plain head and tb_argmax_part_last (every path but head-pick). bloom-560m ITL p50
# (10 prompts) P W0 W1 W2 W3 twice, gpt2 P W0 W2 once, then each bloom-560m arm traced.
# Predicted (before the call): if the reduction's RED is what costs (the block's slot held
# until it is acknowledged), W1 and W2 are P's head (~120 us) and W3 worse than W0; if the
# epilogue's instructions cost, W2 = W1 = W0 and all ~12 us slower.
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOHP=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold,gemv-wide,cache-first
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all limit=10 env="" mode=0
  case $label in P*) f=$NOHP ;; W*) mode=${label:1:1} ;; esac
  case $label in T*) limit=4; mode=${label:1:1}; [ "$mode" = P ] && { f=$NOHP; mode=0; }
    env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env TB_PICK_MODE=$mode $env timeout 150 /tmp/bench --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
for r in 1 2; do for l in P W0 W1 W2 W3; do one $l bloom-560m; done; done
for l in P W0 W2; do one $l gpt2; done
for l in TP T0 T1 T2 T3; do one $l bloom-560m; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
grep -E "^####|step span|tb_skinny_head|tb_argmax" $OUT/timelines.txt | head -60
