# ab-run52 (#37): 0eca40a, asked for one H200 (kind nvidia-h200), given one H100: the generation suite 128 + 128, batch 1, bf16, F every
# path, S every path but norm-stats: bloom-7b1 F S S F (on 2x H200 hosts folding its norms
# inside the GEMV's loop was +0.11 ms: results/h200x2/gate-run40, ln1-run1).
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model
  local label=$1 m=$2 flags=()
  case $label in S*) flags=(--fused $S) ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 /tmp/ab-bench --model $m --batch-size 1 --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for l in F1 S1 S2 F2; do one $l bloom-7b1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
