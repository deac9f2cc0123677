# knob-run65 (#37): an experiment binary (exp-nt: four-tile blocks from 2304 columns by default,
# TB_ATTN_R, TB_PDL_ROWS, late PDL triggers in the projections and the head attention), one
# H100. Generation suite 128 + 128, bf16, every path but skinny-split, inter-token p50, same
# binary and call: B as built; R3 / R4 the batch-16 attention with 3 / 4 keys a lane a round
# (TB_ATTN_R); P programmatic edges up to 16 rows (TB_PDL_ROWS=16); then the step's kernels
# under ncu for B and R4.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
variant() { ENVS=(); case $1 in R3*) ENVS=(TB_ATTN_R=3) ;; R4*) ENVS=(TB_ATTN_R=4) ;; P*) ENVS=(TB_PDL_ROWS=16) ;; esac; }
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --fused $S"
one() { # label model batch
  variant $1
  echo "== $1 $2 bs$3" >> $OUT/ab.txt
  env "${ENVS[@]}" timeout 150 /tmp/ab-bench --model $2 --batch-size $3 $G --log-dir /tmp/ablogs/$1-$2-bs$3 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do for l in B1 R3a R4a P1 P2 R4b R3b B2; do one $l $m 16; done; done
for m in gpt2 bloom-560m; do for l in B1 P1; do one $l $m 8; done; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
NCU="ncu --profile-from-start off --clock-control none --cache-control none --target-processes all --metrics gpu__time_duration.sum"
mkdir -p /tmp/prof
prof() { # label model
  variant $1
  env "${ENVS[@]}" TB_CUDA_PROFILE=2 timeout 200 $NCU -f -o /tmp/prof/$1-$2 /tmp/ab-bench --weights random --seed 0 --device cuda --dtype bf16 \
    --log-dir /tmp/prof-logs --no-progress --suite generation --prompt-lens 128 --new-tokens 4 --batch-size 16 --limit 1 \
    --min-time 0 --min-batches 0 --model $2 --fused $S > /tmp/prof/$1-$2.txt 2>&1
  echo "$1 $2: exit $?" >> $OUT/prof.txt
  ncu -i /tmp/prof/$1-$2.ncu-rep --csv --page raw --print-units base --metrics gpu__time_duration.sum > /tmp/prof/$1-$2.csv
  rm -f /tmp/prof/$1-$2.ncu-rep
}
for m in gpt2 bloom-560m; do prof B $m; prof R4 $m; done
(cd /tmp && tar czf $OUT/prof.tgz prof)
cat $OUT/prof.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
