# wide-run105 (#37): the submitted 0bab297 (`--fused gemv-wide`) on the other models it touches or
# should not, one H200: the generation suite 128 + 128, bf16, batch 1, inter-token p50, W every
# path, O every path but gemv-wide (the same binary): bloom-1b7 (proj K 2048: the row kernel;
# fc2 K 8192: the old GEMV) and gpt2-medium (proj K 1024 wide, fc2 K 4096 the row kernel) W O O W,
# bloom-7b1 (norm-stats slots: unchanged expected) W O.
export NCCL_NVLS_ENABLE=0
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOWIDE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all
  case $label in O*) f=$NOWIDE ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 /tmp/bench --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in W1 O1 O2 W2; do one $l bloom-1b7; done
for l in W1 O1 O2 W2; do one $l gpt2-medium; done
for l in W1 O1; do one $l bloom-7b1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
