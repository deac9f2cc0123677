# knob-run74 (#37): knob-run73's binary, the best knobs together, one H100, generation suite
# 128 + 128, bf16, batch 16, every path, inter-token p50; B = no knob; mirrored order.
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench-x.xz'),open('/tmp/bench','wb'))"; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 16"
one() { local label=$1 m=$2; shift 2; echo "== $label $m $*" >> $OUT/ab.txt
  env "$@" timeout 150 /tmp/bench --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
A="TB_SKINNY_U1=4 TB_HEAD_X=4u2f"; W="TB_SKINNY_NT4=2 TB_SKINNY_U2=2"
one B1 gpt2; one A1 gpt2 $A; one AW1 gpt2 $A $W; one AW2 gpt2 $A $W; one A2 gpt2 $A; one B2 gpt2
one B1 bloom-560m; one A1 bloom-560m $A; one AW1 bloom-560m $A $W; one AW2 bloom-560m $A $W; one A2 bloom-560m $A; one B2 bloom-560m
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
