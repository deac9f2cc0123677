# h100-run68 (#37): the submitted 7ded869 (N) against 062270e's code bbbbd3f (O) on one H100
# (gate-run67 ran on 2x H200): generation suite 128 + 128, bf16, every path, inter-token p50;
# gpt2 and bloom-560m batch 16 O N N O, batch 1 N.
export NCCL_NVLS_ENABLE=0
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 bin=/tmp/bench
  case $label in O*) bin=/tmp/bench-old ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab.txt
  timeout 150 $bin --model $m --batch-size $bs $G --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do for l in O1 N1 N2 O2; do one $l $m 16; done; done
for m in gpt2 bloom-560m; do one N1 $m 1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
