# step-run88 (#37): the submitted step kernel 679e3ab on one H100 (gate-run87 ran on 2x H200):
# the generation suite 128 + 128, bf16, batch 1, inter-token p50: S 679e3ab all,step, P fa49aae
# all,step, N 679e3ab every path (graphed); bloom-560m S P N P S, gpt2 S P N.
export NCCL_NVLS_ENABLE=0
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench f=all,step
  case $label in P*) bin=/tmp/bench-old ;; N*) f=all ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 $bin --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in S1 P1 N1 P2 S2; do one $l bloom-560m; done
for l in S1 P1 N1; do one $l gpt2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
