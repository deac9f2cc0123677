# gate-run50 (#37): 2970b26 on one H100: the kernels' GPU tests, then the generation suite
# 128 + 128, batch 1, bf16. Arms: F every path (norm-stats' slots a line each); S every path
# but norm-stats (bloom-7b1 keeps its norms; the small models sum the statistics inside the
# folded GEMV's loop, as 976c082); B the experiment 9e9774d (branch exp-after) with every path
# but norm-stats: the folded GEMV sums the statistics after its weight loop, from x again, and
# every hidden size folds. F S B B S F per model.
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
for b in bench bench-after; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model
  local label=$1 m=$2 bin=/tmp/bench flags=()
  case $label in
    S*) flags=(--fused $S) ;;
    B*) bin=/tmp/bench-after flags=(--fused $S) ;;
  esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 $bin --model $m --batch-size 1 --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
runs() { local m=$1; shift; for l in "$@"; do one $l $m; done; }
for m in gpt2 bloom-560m bloom-7b1; do runs $m F1 S1 B1 B2 S2 F2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
