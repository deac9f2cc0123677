# proj-prof69 (#37): the submitted 7ded869, one H100: ncu's full set for one layer's four
# tensor-core projections in a batch-16 decode step (prompt 128, 4 new tokens; the skinny
# launches of step two, layer 0: qkv, dense / c_proj, the MLP's two), gpt2 and bloom-560m, so
# that what bounds them (L2, L1, DRAM, issue) is read from the counters, not fitted.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
for ms in gpt2:48 bloom-560m:96; do
  m=${ms%%:*}; skip=${ms#*:}
  TB_CUDA_PROFILE=2 timeout 240 ncu --profile-from-start off --clock-control none --target-processes all \
    -k regex:tb_skinny --launch-skip $skip --launch-count 4 --set full --import-source no \
    -f -o /tmp/proj-$m /tmp/ab-bench --suite generation --prompt-lens 128 --new-tokens 4 --batch-size 16 --limit 1 \
    --min-time 0 --min-batches 0 --model $m --weights random --seed 0 --device cuda --dtype bf16 \
    --log-dir /tmp/prof-logs --no-progress > $OUT/proj-$m-run.txt 2>&1
  echo "$m exit $?" >> $OUT/proj-$m-run.txt
  ncu -i /tmp/proj-$m.ncu-rep --print-details all > $OUT/proj-$m-details.txt 2>&1
  cp /tmp/proj-$m.ncu-rep $OUT/
done
gzip -9 $OUT/*.ncu-rep
for m in gpt2 bloom-560m; do
  grep -E "tb_skinny|^    Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Executed Ipc E" $OUT/proj-$m-details.txt | head -60
done
