# skinny-run5 (exp-skinny2): bloom-7b1 batch 16, the skinny kernel's column tiles and rounds for
# 4096+ columns (TB_SKINNY_BIG=nt,u); bf16 with the weight limit lifted (TB_SKINNY_ALL=1) on GPU 0,
# fp8 on GPU 1; a7663d0 (before) and the experiment binary's defaults as baselines on each
export NCCL_NVLS_ENABLE=0
for b in bench-exp bench-before; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label binary model bs dtype [flags]
  local gpu=$1 label=$2 bin=$3 m=$4 bs=$5 d=$6; shift 6
  echo "== $label $m bs$bs $d" >> $OUT/ab-gpu$gpu.txt
  CUDA_VISIBLE_DEVICES=$gpu timeout 120 /tmp/ab-$bin --model $m --batch-size $bs --dtype $d $G "$@" \
    --log-dir /tmp/logs/$label-$m-bs$bs-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$gpu.txt
}
gpu0() {
  one 0 before bench-before bloom-7b1 16 bf16; one 0 default bench-exp bloom-7b1 16 bf16
  for s in 2,2 4,2 4,4 8,1 8,2; do TB_SKINNY_ALL=1 TB_SKINNY_BIG=$s one 0 all-$s bench-exp bloom-7b1 16 bf16; done
  TB_SKINNY_ALL=1 TB_SKINNY_BIG=4,2 one 0 all-4,2 bench-exp bloom-560m 16 bf16
  one 0 default bench-exp bloom-560m 16 bf16
}
gpu1() {
  one 1 before bench-before bloom-7b1 16 fp8; one 1 default bench-exp bloom-7b1 16 fp8
  for s in 4,2 4,4 8,1 2,2; do TB_SKINNY_BIG=$s one 1 big-$s bench-exp bloom-7b1 16 fp8; done
  for s in 2,2 4,2; do TB_SKINNY_BIG=$s one 1 big-$s bench-exp bloom-560m 16 fp8; done
}
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
for g in 0 1; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9}'; done
