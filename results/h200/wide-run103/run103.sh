# wide-run103 (#37): gemv-wide with each column's bias, residual and folded sums loaded with x (wide-run102 loaded them after each dot product; bloom-560m 0.591
# -> 0.687 on 2x H200, 0.617 on one H200). Experiment binary 5b42ad5 (branch gemv-wide-knob), one
# H200. Generation suite 128 + 128, bf16, batch 1, inter-token p50: O every path but gemv-wide;
# W7 every path; W1 / W2 / W4 only the folded (qkv, fc) / the bias at K <= 1024 (proj) / the row
# kernel (fc2) wide (TB_WIDE_MASK); W7L / W1L the same with the weights loaded after the wait
# (TB_WIDE_LATE=1); W6 proj and fc2 wide. bloom-560m O W7 W1 W6 W2 W4 W7 O; gpt2 O W7 W1 W6 O.
export NCCL_NVLS_ENABLE=0
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOWIDE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all env=""
  case $label in O*) f=$NOWIDE ;; W7) ;; W1) env="TB_WIDE_MASK=1" ;; W2) env="TB_WIDE_MASK=2" ;; W4) env="TB_WIDE_MASK=4" ;;
    W6) env="TB_WIDE_MASK=6" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env $env timeout 100 /tmp/bench --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in O1 W7 W1 W6 W2 W4 W7 O2; do one $l bloom-560m; done
for l in O1 W7 W1 W6 O2; do one $l gpt2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
