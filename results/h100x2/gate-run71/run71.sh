# gate-run71 (#37): the submitted code, x in 16-byte loads in the pipelined projections and in
# the LM head at 2-16 rows (tb_skinny_head_wide), the one-row head as before: multi-smoke (both
# GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times the generation suite
# 128 + 128, bf16, every path, inter-token p50: N the new code, O f19b77f (7ded869's kernels);
# gpt2 and bloom-560m batch 16 O N N O, batch 1 N O O N; then ncu (four sections) on N for one
# layer's projections and gpt2's head at batch 16, as proj-prof69 took them on O.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 bin=/tmp/bench
  case $label in O*) bin=/tmp/bench-old ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab-gpu1.txt
  CUDA_VISIBLE_DEVICES=1 timeout 150 $bin --model $m --batch-size $bs $G --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab-gpu1.txt
}
prof() { # model launch-skip
  CUDA_VISIBLE_DEVICES=1 TB_CUDA_PROFILE=2 timeout 200 ncu --profile-from-start off --clock-control none --target-processes all \
    -k regex:tb_skinny --launch-skip $2 --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --import-source no \
    -f -o /tmp/proj-$1 /tmp/bench --suite generation --prompt-lens 128 --new-tokens 4 --batch-size 16 --limit 1 \
    --min-time 0 --min-batches 0 --model $1 --weights random --seed 0 --device cuda --dtype bf16 \
    --log-dir /tmp/prof-logs --no-progress > $OUT/proj-$1-run.txt 2>&1
  echo "$1 exit $?" >> $OUT/proj-$1-run.txt
  ncu -i /tmp/proj-$1.ncu-rep --print-details all > $OUT/proj-$1-details.txt 2>&1
}
gpu1() {
  for m in gpt2 bloom-560m; do for l in O1 N1 N2 O2; do one $l $m 16; done; done
  for m in gpt2 bloom-560m; do for l in N1 O1 O2 N2; do one $l $m 1; done; done
  prof gpt2 48; prof bloom-560m 96
}
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
gzip -9 $OUT/proj-*-details.txt
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
paste - - < $OUT/ab-gpu1.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab-gpu1.txt | head
for m in gpt2 bloom-560m; do
  zcat $OUT/proj-$m-details.txt.gz | grep -E "tb_skinny|^    Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Achieved Occupancy|Registers Per" | head -40
done
cat $OUT/host.txt
