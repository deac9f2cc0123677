# h100 ew-run4 (#37): db67dba (gated in results/h200x2/gate-run37) on one H100: the generation suite
# 128 + 128 at batch 1, F every path (the default) against S every path but gemv-head,
# trigger-first and early-weights (0da8b4d's kernels), F S S F: bloom-7b1 bf16 and fp8, gpt2,
# bloom-560m
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
BASE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
BASE=$BASE,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model bs dtype
  local label=$1 m=$2 b=$3 d=$4 flags=()
  case $label in S*) flags=(--fused $BASE) ;; esac
  echo "== $label $m bs$b $d" >> $OUT/ab.txt
  timeout 100 /tmp/ab-bench --model $m --batch-size $b --dtype $d $G "${flags[@]}" --log-dir /tmp/logs/$label-$m-bs$b-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab.txt
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
for c in bloom-7b1:bf16 bloom-7b1:fp8 gpt2:bf16 bloom-560m:bf16; do
  IFS=: read m d <<< "$c"; for l in F1 S1 S2 F2; do one $l $m 1 $d; done
done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
paste - - < $OUT/ab.txt | awk '{print $2,$3,$4,$5,$9}'
