# exp-run120 (#37): is the one-row LM head (tb_skinny_head, 110 registers: two blocks an SM,
# each loading its whole 32 KB round at once) bound by the bytes two blocks keep in flight?
# exp-run119 says a block's last lines cost the head far more than their instructions (the
# head that picks: 12-16 us slower on bloom-560m with no write at all). One H200, experiment
# binary a2783fd (branch head-occ: main's d121337 plus a knob TB_HEAD_OCC): P the head as on
# main; O3 the same kernel with __launch_bounds__(256, 3) (80 registers, no spill, three blocks
# an SM, but ptxas puts 2 of its 8 weight loads after the round's first mma); O4 (256, 4) (64
# registers, 10 spill stores). bloom-560m and gpt2 ITL p50 (10 prompts) P O3 O4 twice, then
# bloom-560m P, O3 and O4 traced.
# Predicted (before the call): if the head is bound by bytes in flight, O3 faster: bloom-560m's
# head 120 -> 110-116 us (P 0.466 -> O3 0.456-0.462), gpt2's 22.6 -> 20.5-21.5; O4 no better
# than O3 (its spills); if it is bound by DRAM bandwidth (4.3 TB/s now), O3 = P within 2 us.
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 limit=10 env="" occ=""
  case $label in *O3) occ=3 ;; *O4) occ=4 ;; esac
  case $label in T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env TB_HEAD_OCC=$occ $env timeout 150 /tmp/bench --fused all --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
for r in 1 2; do for l in P O3 O4; do one $l bloom-560m; done; done
for r in 1 2; do for l in P O3 O4; do one $l gpt2; done; done
for l in TP TO3 TO4; do one $l bloom-560m; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
grep -E "^####|step span|tb_skinny_head|tb_argmax" $OUT/timelines.txt | head -40
