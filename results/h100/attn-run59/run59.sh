# attn-run59 (#37): the batch-16 attention kernel's keys a lane a round, one H100, generation
# suite 128 + 128, bf16, every path, inter-token p50: F main's 0686493 (2 keys a lane a round,
# 64 keys a round at head size 64), R3 700cd0c (exp-r3: 3, 96 keys), R4 c1a55d3 (exp-r4: 4,
# 128 keys; 42 bytes of spills at bf16); the rounds' loads issued one round ahead in each.
# gpt2 and bloom-560m batch 16 F R3 R4 R4 R3 F; bloom-560m batch 8 and bloom-7b1 batch 16 F R3 R4.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
for b in bench bench-r3 bench-r4; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 bin=/tmp/bench
  case $label in R3*) bin=/tmp/bench-r3 ;; R4*) bin=/tmp/bench-r4 ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab.txt
  timeout 150 $bin --model $m --batch-size $bs $G --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do for l in F1 R31 R41 R42 R32 F2; do one $l $m 16; done; done
for l in F1 R31 R41; do one $l bloom-560m 8; done
for l in F1 R31 R41; do one $l bloom-7b1 16; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
