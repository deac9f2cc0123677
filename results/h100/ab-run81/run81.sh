# ab-run81 (#37): the submitted a927426 on one H100 (the gates ran on 2x H200): generation suite
# 128 + 128, bf16, every path, batch 1, inter-token p50; N a927426, O 53d485d (066c3ec's
# kernels, cuBLAS's head); bloom-560m N O O N, gpt2 N O.
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench; case $label in O*) bin=/tmp/bench-old ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 $bin --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in N1 O1 O2 N2; do one $l bloom-560m; done
one N1 gpt2; one O1 gpt2
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
