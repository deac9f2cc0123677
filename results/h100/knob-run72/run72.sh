# knob-run72 (#37): an experiment binary (branch exp-u over 62ebce1: x in 16-byte loads), one
# H100, generation suite 128 + 128, bf16, batch 16, every path, inter-token p50. Knobs:
# TB_SKINNY_U1 / TB_SKINNY_U4 (rounds of 3 or 4 slices for the projections of one / four
# tiles, pipelined; 2 without), TB_HEAD_X (gpt2's head at 16 rows as NT tiles, U slices,
# p(ipelined) / f(lat): 4u2f 4u2p 8u1p 8u2f 2u2p; 2u4f without). B = no knob, first and last.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench-x.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 16"
one() { # label model [VAR=value]
  local label=$1 m=$2; shift 2
  echo "== $label $m $*" >> $OUT/ab.txt
  env "$@" timeout 150 /tmp/bench --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do
  one B1 $m
  one U1a $m TB_SKINNY_U1=3
  one U1b $m TB_SKINNY_U1=4
  one U4a $m TB_SKINNY_U4=3
  one U4b $m TB_SKINNY_U4=4
  if [ $m = gpt2 ]; then for h in 4u2f 4u2p 8u1p 8u2f 2u2p; do one H$h $m TB_HEAD_X=$h; done; fi
  one B2 $m
done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
