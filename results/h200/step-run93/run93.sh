# step-run93 (#37): a diagnostic of the three-stage step kernel (branch step4-diag: 5f02b9c, the
# copies' own warp, plus TB_STEP_DIAG=noatomic, which stores the f32 sums of proj and fc2
# instead of adding them: wrong outputs, for timing only) on one H200. Do the stages' input
# reads of the sums wait on the atomic adds? Traces (bloom-560m, gpt2, batch 1, an eager step)
# with and without noatomic; then the generation suite 128 + 128, bf16, batch 1, inter-token
# p50: D step4-diag all,step, X the same with noatomic, P 0ea6615 (main) all,step; bloom-560m
# D X P X D, gpt2 D X P.
export NCCL_NVLS_ENABLE=0
for b in bench bench-prev; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
T="--engine candle --weights random --seed 0 --device cuda --dtype bf16 --batch-size 1 --suite generation --prompt-lens 128 --new-tokens 32 --limit 2 --min-time 0 --min-batches 0 --no-progress"
mkdir -p /tmp/traces
for mv in bloom-560m:none bloom-560m:noatomic gpt2:none gpt2:noatomic; do m=${mv%:*} v=${mv#*:}
  TB_STEP_DIAG=$v TB_STEP_TRACE=/tmp/traces/trace-$m-$v.bin timeout 100 /tmp/bench --fused all,step --model $m $T --log-dir /tmp/trace-logs > /tmp/traces/trace-$m-$v.txt 2>&1
  python3 scripts/step_trace.py /tmp/traces/trace-$m-$v.bin >> $OUT/trace-summary.txt 2>&1
done
(cd /tmp && tar czf $OUT/traces.tgz traces trace-logs)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench v=none
  case $label in P*) bin=/tmp/bench-prev ;; X*) v=noatomic ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  TB_STEP_DIAG=$v timeout 150 $bin --fused all,step --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in D1 X1 P1 X2 D2; do one $l bloom-560m; done
for l in D1 X1 P1; do one $l gpt2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
cat $OUT/trace-summary.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
