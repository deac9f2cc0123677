# gate-run25: the final binaries (74a3901): multi-smoke, then the kernels' GPU tests (GPU 0) and
# batch-1 / batch-8 A/B there, while GPU 1 alternates a7663d0 (before) and 74a3901 at batch 16
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-before; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu binary model bs dtype
  echo "== $2 $3 bs$4 $5" >> $OUT/ab-gpu$1.txt
  CUDA_VISIBLE_DEVICES=$1 timeout 120 /tmp/ab-$2 --model $3 --batch-size $4 --dtype $5 $G --log-dir /tmp/logs/$2-$3-bs$4-$5 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$1.txt
}
gpu1() {
  for c in gpt2:16:bf16 bloom-560m:16:bf16; do IFS=: read m b d <<< "$c"
    one 1 bench-before $m $b $d; one 1 bench $m $b $d; one 1 bench $m $b $d; one 1 bench-before $m $b $d; done
  for c in bloom-7b1:16:fp8 bloom-7b1:16:bf16 bloom-560m:16:fp8; do IFS=: read m b d <<< "$c"
    one 1 bench-before $m $b $d; one 1 bench $m $b $d; done
}
gpu0() {
  CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
  for c in gpt2:1:bf16 bloom-560m:1:bf16 gpt2:8:bf16 bloom-560m:8:bf16 gpt2:16:fp8; do IFS=: read m b d <<< "$c"
    one 0 bench-before $m $b $d; one 0 bench $m $b $d; done
}
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
for g in 1 0; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9}'; done
