# step-run92 (#37): the three-stage step kernel with its copies in 8 KB chunks, a window of them in
# flight a block (branch step4, TB_STEP_WINDOW), on one H200 (no H100 lent). The step kernel's
# and the decode kernels' GPU tests (the default window, 4); traces (bloom-560m at windows 4 and
# 16, gpt2 at 4; batch 1, an eager step); then the generation suite 128 + 128, bf16, batch 1,
# inter-token p50: S<w> step4 all,step with window w, P 0ea6615 (main) all,step, N step4 every
# path (graphed); bloom-560m S4 S2 S8 S16 P N S4, gpt2 S4 S8 P N.
export NCCL_NVLS_ENABLE=0
for b in bench bench-prev; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
KERNEL_FILTER="gpu_tests::step gpu_tests::decode" timeout 240 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
T="--engine candle --weights random --seed 0 --device cuda --dtype bf16 --batch-size 1 --suite generation --prompt-lens 128 --new-tokens 32 --limit 2 --min-time 0 --min-batches 0 --no-progress"
mkdir -p /tmp/traces
for mw in bloom-560m:4 bloom-560m:16 gpt2:4; do m=${mw%:*} w=${mw#*:}
  TB_STEP_WINDOW=$w TB_STEP_TRACE=/tmp/traces/trace-$m-w$w.bin timeout 100 /tmp/bench --fused all,step --model $m $T --log-dir /tmp/trace-logs > /tmp/traces/trace-$m-w$w.txt 2>&1
  python3 scripts/step_trace.py /tmp/traces/trace-$m-w$w.bin >> $OUT/trace-summary.txt 2>&1
done
(cd /tmp && tar czf $OUT/traces.tgz traces trace-logs)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench f=all,step w=4
  case $label in P*) bin=/tmp/bench-prev ;; N*) f=all ;; S*) w=${label#S}; w=${w%_*} ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  TB_STEP_WINDOW=$w timeout 150 $bin --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in S4 S2 S8 S16 P N S4_2; do one $l bloom-560m; done
for l in S4 S8 P N; do one $l gpt2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed|rel " $OUT/kernels.txt | head -30
cat $OUT/trace-summary.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
