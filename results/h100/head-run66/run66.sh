# head-run66 (#37): an experiment binary (exp-nt, the LM head's kernel as a knob), one H100.
# The tensor-core LM head's test with the knob; generation suite 128 + 128, bf16, every path
# but skinny-split, inter-token p50, same binary and call: B as built (gpt2's head: the head
# kernel, two tiles a block, four-slice rounds unpipelined; bloom's: cuBLAS); H4 / H2 gpt2's head
# through the pipelined projection kernel of four / two tiles a block at 5-16 rows (TB_HEAD_NT);
# F4 bloom-560m's head through the four-tile kernel (TB_HEAD_FORCE=1 TB_HEAD_NT=4); then the
# step's kernels under ncu.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/tests.xz /tmp/unit-tests; chmod +x /tmp/unit-tests
for nt in 4 2; do TB_HEAD_NT=$nt /tmp/unit-tests gpu_tests::matmul::skinny_matches --test-threads 1 >> $OUT/tests-head.txt 2>&1; done
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
S=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
S=$S,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
S=$S,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold
variant() { ENVS=(); case $1 in H4*) ENVS=(TB_HEAD_NT=4) ;; H2*) ENVS=(TB_HEAD_NT=2) ;; F4*) ENVS=(TB_HEAD_FORCE=1 TB_HEAD_NT=4) ;; esac; }
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --fused $S"
one() { # label model batch
  variant $1
  echo "== $1 $2 bs$3" >> $OUT/ab.txt
  env "${ENVS[@]}" timeout 150 /tmp/ab-bench --model $2 --batch-size $3 $G --log-dir /tmp/ablogs/$1-$2-bs$3 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for l in B1 H4a H2a H2b H4b B2; do one $l gpt2 16; done
for l in B1 H4a H2a; do one $l gpt2 8; done
for l in B1 F4a F4b B2; do one $l bloom-560m 16; done
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
for v in H4 H2; do prof $v gpt2; done; prof F4 bloom-560m
(cd /tmp && tar czf $OUT/prof.tgz prof)
grep -E "test result|FAILED|panicked|failed" $OUT/tests-head.txt | head
cat $OUT/prof.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
