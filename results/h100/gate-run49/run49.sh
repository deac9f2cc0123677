# gate-run49 (#37): 96eb716 on one H100 (gate-run48 again, f64 addresses fixed): the kernels' GPU tests, then the generation suite
# 128 + 128, bf16. Arms: F every path; S every path but norm-stats (bloom-7b1 then keeps its
# norms, the small models sum the statistics inside the folded GEMV, as 976c082). Batch 1:
# F S S F per model; then batch 16 gpt2 and bloom-560m, F once each (not re-measured on H100
# since gate-run27's kernels).
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model batch
  local label=$1 m=$2 b=$3 flags=()
  case $label in S*) flags=(--fused $S) ;; esac
  echo "== $label $m bs$b" >> $OUT/ab.txt
  timeout 150 /tmp/bench --model $m --batch-size $b --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/$label-$m-bs$b 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
runs() { local m=$1 b=$2; shift 2; for l in "$@"; do one $l $m $b; done; }
for m in gpt2 bloom-560m bloom-7b1; do runs $m 1 F1 S1 S2 F2; done
for m in gpt2 bloom-560m; do runs $m 16 F1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
