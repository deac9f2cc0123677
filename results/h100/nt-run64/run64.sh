# nt-run64 (#37): an experiment binary (0caacf8: tiles a block and skinny-split as knobs), one
# H100. The tensor-core projections' tests with two-tile blocks from 768 columns; the batch-16
# step's kernels under ncu; the generation suite 128 + 128, bf16, inter-token p50, same binary
# and call. Variants: S every path but skinny-split (main's projections: one tile a block below
# 4096 columns); V1 S with two-tile blocks from 2304 columns (TB_SKINNY_NT2_FROM=2304); V2 S with
# four-tile blocks from 2304 (TB_SKINNY_NT4_FROM=2304); V3 S with two-tile blocks from 768
# columns; V4 every path (skinny-split) with two-tile blocks from 768 columns.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/tests.xz /tmp/unit-tests; chmod +x /tmp/unit-tests
TB_SKINNY_NT2_FROM=768 /tmp/unit-tests gpu_tests::matmul::skinny gpu_tests::norm_fold::skinny --test-threads 1 > $OUT/tests-nt2.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
variant() { # label -> FLAGS, ENVS
  FLAGS=(--fused $S); ENVS=()
  case $1 in
    V1*) ENVS=(TB_SKINNY_NT2_FROM=2304) ;;
    V2*) ENVS=(TB_SKINNY_NT4_FROM=2304) ;;
    V3*) ENVS=(TB_SKINNY_NT2_FROM=768) ;;
    V4*) ENVS=(TB_SKINNY_NT2_FROM=768); FLAGS=() ;;
  esac
}
NCU="ncu --profile-from-start off --clock-control none --cache-control none --target-processes all --metrics gpu__time_duration.sum"
mkdir -p /tmp/prof
prof() { # label model: one generate call (batch 16, prompt 128, 4 new tokens), every kernel under ncu
  variant $1
  env "${ENVS[@]}" TB_CUDA_PROFILE=2 timeout 200 $NCU -f -o /tmp/prof/$1-$2 /tmp/ab-bench --weights random --seed 0 --device cuda --dtype bf16 \
    --log-dir /tmp/prof-logs --no-progress --suite generation --prompt-lens 128 --new-tokens 4 --batch-size 16 --limit 1 \
    --min-time 0 --min-batches 0 --model $2 "${FLAGS[@]}" > /tmp/prof/$1-$2.txt 2>&1
  echo "$1 $2: exit $?" >> $OUT/prof.txt
  ncu -i /tmp/prof/$1-$2.ncu-rep --csv --page raw --print-units base --metrics gpu__time_duration.sum > /tmp/prof/$1-$2.csv
  rm -f /tmp/prof/$1-$2.ncu-rep
}
for m in gpt2 bloom-560m; do for v in S V1 V2 V4; do prof $v $m; done; done
(cd /tmp && tar czf $OUT/prof.tgz prof)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  variant $1
  echo "== $1 $2 bs$3" >> $OUT/ab.txt
  env "${ENVS[@]}" timeout 150 /tmp/ab-bench --model $2 --batch-size $3 $G "${FLAGS[@]}" --log-dir /tmp/ablogs/$1-$2-bs$3 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do for l in S1 V1a V2a V3a V4a V4b V3b V2b V1b S2; do one $l $m 16; done; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/tests-nt2.txt | head -20
cat $OUT/prof.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
