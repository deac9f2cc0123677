# knob-run73 (#37): the experiment binary of knob-run72 with more kernels (branch exp-u), one
# H100, generation suite 128 + 128, bf16, batch 16, every path, inter-token p50. Knobs:
# TB_SKINNY_U1 (rounds of 4, 6, 8 slices at one tile), TB_SKINNY_NT4=2 with TB_SKINNY_U2 = 2 / 4
# (the wide projections at two tiles), TB_HEAD_X (gpt2's head: 4u2f 4u3f 4u4f 8u3f), and the
# best of each together. B = no knob, first and last.
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
  for u in 4 6 8; do one U1$u $m TB_SKINNY_U1=$u; done
  one W22 $m TB_SKINNY_NT4=2 TB_SKINNY_U2=2
  one W24 $m TB_SKINNY_NT4=2 TB_SKINNY_U2=4
  if [ $m = gpt2 ]; then
    for h in 4u2f 4u3f 4u4f 8u3f; do one H$h $m TB_HEAD_X=$h; done
    one C4 $m TB_SKINNY_U1=4 TB_HEAD_X=4u2f
    one C6 $m TB_SKINNY_U1=6 TB_HEAD_X=4u3f
  fi
  one B2 $m
done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$5,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
