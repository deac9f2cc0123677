# trace-run106 (#37): where bloom-560m's and gpt2's graphed batch-1 decode steps spend their time,
# kernel by kernel, from CUPTI's activity records (scripts/probes/kernel_trace.c, an injection
# library: no change to the binary traced; scripts/kernel_timeline.py). One H200, generation
# suite 128 + 128, bf16, batch 1. M: main's 0bab297 (every path, `all`); K: a436cd5 (branch
# wide-knob2: main + TB_WIDE_MASK: 1 folded qkv/fc wide, 2 proj wide, 4 fc2 the row kernel, 8 fc2
# as one wave). Untraced runs give the ITL the trace may perturb.
export NCCL_NVLS_ENABLE=0
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/knob.xz /tmp/knob; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/bench /tmp/knob
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1 --fused all"
# one LABEL BINARY MODEL MASK TRACED
one() { local label=$1 bin=$2 m=$3 mask=$4 traced=$5 limit=10 env=""
  [ $traced = t ] && { limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv"; }
  echo "== $label $m" >> $OUT/ab.txt
  env $env TB_WIDE_MASK=$mask timeout 150 $bin --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ $traced = t ]; then
    echo "#### $label $m (mask $mask)" >> $OUT/timelines.txt
    python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1
  fi; }
mkdir -p /tmp/tr
one M0 /tmp/bench bloom-560m 6 u
one Mt /tmp/bench bloom-560m 6 t
one Mt /tmp/bench gpt2 6 t
one K6 /tmp/knob bloom-560m 6 u
one K7 /tmp/knob bloom-560m 7 u
one K14 /tmp/knob bloom-560m 14 u
one K15 /tmp/knob bloom-560m 15 u
one K7t /tmp/knob bloom-560m 7 t
one K14t /tmp/knob bloom-560m 14 t
one M1 /tmp/bench bloom-560m 6 u
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs && tar czf $OUT/traces.tgz tr)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
grep -A30 '^#### Mt bloom' $OUT/timelines.txt | head -45
