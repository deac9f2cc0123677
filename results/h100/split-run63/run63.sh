# split-run63 (#37): an experiment binary (skinny-split with its knobs), one H100: the kernels'
# GPU tests; the batch-16 decode step's tensor-core projections under ncu with and without
# skinny-split; then the generation suite 128 + 128, bf16, inter-token p50, same binary and call:
# S every path but skinny-split, A every path (clusters of 2 or 4 up to 264 blocks, one-tile
# blocks), B A with up to 528 blocks (TB_SKINNY_SPLIT_BLOCKS=528), C A with four-tile blocks
# split too (TB_SKINNY_SPLIT_NT4=1).
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
NCU="ncu --profile-from-start off --clock-control none --cache-control none --target-processes all --metrics gpu__time_duration.sum"
mkdir -p /tmp/prof
prof() { # label model: one generate call (batch 16, prompt 128, 4 new tokens), every kernel under ncu
  local label=$1 m=$2 flags=() envs=()
  case $label in S*) flags=(--fused $S) ;; B*) envs=(TB_SKINNY_SPLIT_BLOCKS=528) ;; esac
  env "${envs[@]}" TB_CUDA_PROFILE=2 timeout 200 $NCU -f -o /tmp/prof/$label-$m /tmp/ab-bench --weights random --seed 0 --device cuda --dtype bf16 \
    --log-dir /tmp/prof-logs --no-progress --suite generation --prompt-lens 128 --new-tokens 4 --batch-size 16 --limit 1 \
    --min-time 0 --min-batches 0 --model $m "${flags[@]}" > /tmp/prof/$label-$m.txt 2>&1
  echo "$label $m: exit $?" >> $OUT/prof.txt
  ncu -i /tmp/prof/$label-$m.ncu-rep --csv --page raw --print-units base --metrics gpu__time_duration.sum > /tmp/prof/$label-$m.csv
  rm -f /tmp/prof/$label-$m.ncu-rep
}
for m in gpt2 bloom-560m; do prof S $m; prof A $m; done
prof B bloom-560m
python3 scripts/kernel_breakdown.py /tmp/prof/*.csv --last-step tb_decode_begin > $OUT/last-step.txt 2>&1
(cd /tmp && tar czf $OUT/prof.tgz prof)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 flags=() envs=()
  case $label in S*) flags=(--fused $S) ;; B*) envs=(TB_SKINNY_SPLIT_BLOCKS=528) ;; C*) envs=(TB_SKINNY_SPLIT_NT4=1) ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab.txt
  env "${envs[@]}" timeout 150 /tmp/ab-bench --model $m --batch-size $bs $G "${flags[@]}" --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for l in S1 A1 B1 B2 A2 S2; do one $l gpt2 16; done
for l in S1 A1 B1 C1 C2 B2 A2 S2; do one $l bloom-560m 16; done
for m in gpt2 bloom-560m; do for l in S1 A1; do one $l $m 8; done; one A1 $m 1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
cat $OUT/prof.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
grep -A14 "bs16" $OUT/last-step.txt | grep -E "##|skinny" | head -40
cat $OUT/host.txt
