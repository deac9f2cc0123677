# l2-run77 (#37): experiment binary 3ce35e1 (branch exp-l2) on one H100, bloom-560m batch 1,
# generation suite 128 + 128, bf16, every path, inter-token p50. B no knob; O 62ebce1 (at one row main's
# kernels); A TB_ALIAS=1 (every block reads block 0's weights: the bound of weights held in
# L2); P<mode>a<ahead> TB_PF=mode TB_PF_AHEAD=ahead (each one-row GEMV prefetches into L2
# the weight read `ahead` projections later: 1 bulk, 2 prefetch.global.L2, 3 evict_last).
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench; shift 2; case $label in O*) bin=/tmp/bench-old ;; esac
  echo "== $label $m $*" >> $OUT/ab.txt
  env "$@" timeout 150 $bin --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
m=bloom-560m
one B1 $m; one O1 $m; one A1 $m TB_ALIAS=1
one P1a1 $m TB_PF=1; one P2a1 $m TB_PF=2; one P3a1 $m TB_PF=3
one P1a2 $m TB_PF=1 TB_PF_AHEAD=2; one P2a2 $m TB_PF=2 TB_PF_AHEAD=2
one P2a4 $m TB_PF=2 TB_PF_AHEAD=4
one P2b2 $m TB_PF=2 TB_PF_AHEAD=2; one P1b2 $m TB_PF=1 TB_PF_AHEAD=2
one P3b1 $m TB_PF=3; one P2b1 $m TB_PF=2; one P1b1 $m TB_PF=1
one A2 $m TB_ALIAS=1; one O2 $m; one B2 $m
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$5,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
