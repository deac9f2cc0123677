# gate-run53 (#37): fe347df (the fold 1024 rows at a time) on one H100: the kernels' GPU tests,
# then the generation suite 128 + 128, batch 1, bf16, bloom-7b1 F S F (F every path, S every
# path but norm-stats: unfolded), for its peak memory (gate-run51, 0eca40a: 15.08 GB folded
# against 14.41 unfolded) and inter-token latency.
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model
  local label=$1 m=$2 flags=()
  case $label in S*) flags=(--fused $S) ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 /tmp/bench --model $m --batch-size 1 --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|peak|rror|panic|note" >> $OUT/ab.txt
}
for l in F1 S1 F2; do one $l bloom-7b1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
for f in /tmp/logs/*/*/*.jsonl /tmp/logs/*/*.jsonl; do [ -f "$f" ] && echo "$f $(grep -o '"peak_memory_bytes":[0-9]*' "$f" | sort -u | tr '\n' ' ')"; done 2>/dev/null | sed 's#/tmp/logs/##' | cut -c1-140
paste - - - < $OUT/ab.txt | head -20
cat $OUT/host.txt
