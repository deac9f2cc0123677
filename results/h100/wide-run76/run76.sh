# wide-run76 (#37): 53d485d against f19b77f (7ded869's kernels) on the larger models whose
# projections at 16 rows now change too (the one-tile ones at rounds of four: gpt2-large's and
# gpt2-xl's attention output, bloom-1b7's dense; their other weights are past MAX_WEIGHT,
# cuBLASLt's), one H100, generation suite 128 + 128, bf16, batch 16, every path, inter-token
# p50, O N N O.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 16"
one() { local label=$1 m=$2 bin=/tmp/bench; case $label in O*) bin=/tmp/bench-old ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 $bin --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for m in gpt2-large gpt2-xl bloom-1b7; do for l in O1 N1 N2 O2; do one $l $m; done; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
