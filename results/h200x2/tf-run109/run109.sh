# tf-run109 (#37): which wide kernels should trigger the next kernel first, on a 2x H200 host
# (gate-run108 there: every one triggering first was slower than main, 0.590 -> 0.623, while one
# H200 in tf-run107 had 0.574 -> 0.495). K: 3b60878 (branch wide-knob2): TB_WIDE_MASK 6 main's
# kernels, 7 the folded qkv/fc wide too; TB_WIDE_TF bits, the kernels that trigger first: 1 qkv,
# 2 fc, 4 proj, 8 fc2. Both GPUs run the same arms in opposite orders; generation suite 128 + 128,
# bf16, batch 1, ITL p50. Predicted (before the call): 7:15 about 0.62 as in gate-run108; if fc2
# launched early (its 8.4 MB loading with fc's) is what the x2 host pays for, 7:4 and 7:6 below
# 6:0 (0.590) by 10-30 us and the arms with bit 8 the slowest.
export NCCL_NVLS_ENABLE=0
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/knob.xz /tmp/knob; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13; chmod +x /tmp/knob
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,clocks.max.mem,pci.bus_id --format=csv > $OUT/host.txt
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE >> $OUT/host.txt 2>&1
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1 --fused all --limit 10"
one() { local gpu=$1 m=$2 mask=$3 tf=$4 label=g$1-m$3-tf$4
  echo "== $label $m" >> $OUT/ab$gpu.txt
  CUDA_VISIBLE_DEVICES=$gpu TB_WIDE_MASK=$mask TB_WIDE_TF=$tf timeout 150 /tmp/knob --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab$gpu.txt; }
ARMS="6:0 7:15 7:0 7:4 7:6 7:12 7:5 7:13 7:14 7:7"
REV=$(echo $ARMS | tr ' ' '\n' | tac | tr '\n' ' ')
run() { local gpu=$1; shift; for a in "$@"; do one $gpu bloom-560m ${a%:*} ${a#*:}; done
  for a in 6:0 7:15 7:6 7:4; do one $gpu gpt2 ${a%:*} ${a#*:}; done; }
run 0 $ARMS & run 1 $REV & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
for g in 0 1; do awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab$g.txt | sort -k2,2 -k1,1; done
grep -E "note|rror|panic" $OUT/ab*.txt | head
head -4 $OUT/host.txt
