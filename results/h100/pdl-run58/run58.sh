# pdl-run58 (#37): 0686493 (skinny-fold, the fixed test), one H100: the kernels' GPU tests,
# then the generation suite 128 + 128, bf16, inter-token p50, every path: F main's binary
# (programmatic edges up to 4 rows), P the experiment f003e87 (exp-pdl16: 0686493 with
# TB_PDL_ROWS overriding pdl's MAX_ROWS) with TB_PDL_ROWS=16; gpt2 and bloom-560m at
# batch 16 F P P F, batch 8 F P.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
for b in bench bench-exp; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 bin=/tmp/bench env=()
  case $label in P*) bin=/tmp/bench-exp; env=(TB_PDL_ROWS=16) ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab.txt
  env "${env[@]}" timeout 150 $bin --model $m --batch-size $bs $G --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for m in gpt2 bloom-560m; do for l in F1 P1 P2 F2; do one $l $m 16; done; done
for m in gpt2 bloom-560m; do for l in F1 P1; do one $l $m 8; done; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
