# step-run95 (#37): a third diagnostic of the three-stage step kernel (branch step4-diag, dc6e63f)
# on one H200: is stage A's 3.4 us before its normed input a cold start (the norm's code, the
# weights' lines) or the L2 round trip itself? TB_STEP_DIAG=twice runs A's norm a second time
# right after the first (its reads of the f32 sums again from L2; wrong outputs): marks 0 and 1
# are the ends of the first and the second. Traces (bloom-560m, batch 1, an eager step): none,
# twice, twice+noprefetch.
export NCCL_NVLS_ENABLE=0
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
T="--engine candle --weights random --seed 0 --device cuda --dtype bf16 --batch-size 1 --suite generation --prompt-lens 128 --new-tokens 32 --limit 2 --min-time 0 --min-batches 0 --no-progress"
mkdir -p /tmp/traces
for v in none twice twice,noprefetch; do
  TB_STEP_DIAG=$v TB_STEP_TRACE=/tmp/traces/trace-bloom-560m-$v.bin timeout 100 /tmp/bench --fused all,step --model bloom-560m $T --log-dir /tmp/trace-logs > /tmp/traces/trace-$v.txt 2>&1
  python3 scripts/step_trace.py /tmp/traces/trace-bloom-560m-$v.bin >> $OUT/trace-summary.txt 2>&1
done
(cd /tmp && tar czf $OUT/traces.tgz traces trace-logs)
cat $OUT/trace-summary.txt; cat $OUT/host.txt
