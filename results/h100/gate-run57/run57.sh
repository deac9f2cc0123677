# gate-run57 (#37): a77804a (skinny-fold), one H100: the kernels' GPU tests, then the generation
# suite 128 + 128, bf16, inter-token p50: F every path, S every path but skinny-fold, same
# binary and call; gpt2 and bloom-560m at batch 16 F S S F, batch 8 F S, batch 1 F.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 flags=()
  case $label in S*) flags=(--fused $S) ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab.txt
  timeout 150 /tmp/ab-bench --model $m --batch-size $bs $G "${flags[@]}" --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do for l in F1 S1 S2 F2; do one $l $m 16; done; done
for m in gpt2 bloom-560m; do for l in F1 S1; do one $l $m 8; done; one F1 $m 1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
