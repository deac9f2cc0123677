# prof-run56 (#37): 5cf2edc (main's code), one H100. Where batch-16 decode time goes, before any change:
# every kernel of one generate call (prompt 128 + 16 new) under ncu (isolated durations), gpt2
# and bloom-560m at batch 16, bloom-560m at batch 1; the last whole decode step by kernel and
# grid; ncu's sections for the batch-16 attention kernel; then the timed steps (generation
# suite 128 + 128, every path, inter-token p50): gpt2 bs16, bloom-560m bs16, bloom-560m bs1.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
GEN_PROF_BATCH=16 GEN_PROF_MODELS="gpt2 bloom-560m" bash scripts/gpu_checks.sh gen-profile > /dev/null 2>&1
mv $OUT/gen-profile.txt $OUT/gen-profile-bs16.txt
GEN_PROF_BATCH=1 GEN_PROF_MODELS="bloom-560m" bash scripts/gpu_checks.sh gen-profile > /dev/null 2>&1
mv $OUT/gen-profile.txt $OUT/gen-profile-bs1.txt
for f in /tmp/prof/gen-*.csv; do python3 scripts/kernel_breakdown.py $f --last-step tb_decode_begin --top 40; done > $OUT/last-step.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
TB_CUDA_PROFILE=2 timeout 240 ncu --profile-from-start off --clock-control none --target-processes all \
  -k regex:tb_decode_attention_head --launch-skip 24 --launch-count 2 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
  /tmp/ab-bench --suite generation --prompt-lens 128 --new-tokens 16 --batch-size 16 --limit 1 --min-time 0 --min-batches 0 \
  --model gpt2 --weights random --seed 0 --device cuda --dtype bf16 --log-dir /tmp/prof-logs --no-progress > $OUT/attn-ncu.txt 2>&1
echo "attn-ncu exit $?" >> $OUT/attn-ncu.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
for mb in "gpt2 16" "bloom-560m 16" "bloom-560m 1"; do set -- $mb
  echo "== $1 bs$2" >> $OUT/ab.txt
  timeout 150 /tmp/ab-bench --model $1 --batch-size $2 $G --log-dir /tmp/ablogs/$1-bs$2 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
cat $OUT/ab.txt; cat $OUT/host.txt; head -c 6000 $OUT/last-step.txt
