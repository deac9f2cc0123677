# tf-run107 (#37): the wide one-row GEMVs triggering the next kernel before they load their
# weights and wait (TB_WIDE_LATE=2), so that each is launched a stage or more ahead and its
# weights are in registers when its input arrives (trace-run106: fc's lead was 1.6-1.8 us for
# 8.4 MB). One H200, generation suite 128 + 128, bf16, batch 1, ITL p50. K: db84ade (branch
# wide-knob2): TB_WIDE_MASK 1 folded qkv/fc wide, 2 proj wide, 4 fc2 the row kernel, 8 fc2 as one
# wave; TB_WIDE_LATE 0 (main's order) or 2 (trigger first). K6 L0 is main's kernels.
# Predicted (before the call): K6L2 +-5 us; K7L2 0.616 -> 0.50-0.56; K15L2 K7L2 +-10 us; gpt2
# 0.226 -> 0.19-0.21.
export NCCL_NVLS_ENABLE=0
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/knob.xz /tmp/knob; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/knob
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1 --fused all"
# one MODEL MASK LATE TRACED
one() { local m=$1 mask=$2 late=$3 traced=$4 limit=10 env="" label=K$2L$3$4
  [ $traced = t ] && { limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv"; }
  echo "== $label $m" >> $OUT/ab.txt
  env $env TB_WIDE_MASK=$mask TB_WIDE_LATE=$late timeout 150 /tmp/knob --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ $traced = t ]; then
    echo "#### $label $m" >> $OUT/timelines.txt
    python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1
  fi; }
mkdir -p /tmp/tr
B=bloom-560m
one $B 6 0 u; one $B 6 2 u; one $B 7 2 u; one $B 15 2 u; one $B 14 2 u; one $B 7 0 u
one $B 7 2 t; one $B 15 2 t
one gpt2 6 0 u; one gpt2 7 2 u; one gpt2 15 2 u
one $B 6 0 u; one $B 7 2 u; one $B 15 2 u
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
grep -A22 '^#### ' $OUT/timelines.txt | grep -v '^  tb_' | head -30
grep -A20 'one layer' $OUT/timelines.txt | head -20
