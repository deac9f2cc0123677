# gate-run46 (#37): d2e568a, the submitted source: multi-smoke (both GPUs), then the kernels'
# GPU tests on GPU 0 while GPU 1 times the generation suite 128 + 128, bf16, d2e568a (F) against
# f0e828e's binary (O), every path each: gpt2 and bloom-560m at batch 4 and 16 (F O O F), and
# bloom-7b1 at batch 1 (F O O F).
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-old; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/ab-$b','wb'))"; chmod +x /tmp/ab-$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label model bs
  local g=$1 label=$2 m=$3 b=$4 bin=/tmp/ab-bench
  case $label in O*) bin=/tmp/ab-bench-old ;; esac
  echo "== $label $m bs$b" >> $OUT/ab-gpu$g.txt
  CUDA_VISIBLE_DEVICES=$g timeout 150 $bin --model $m --batch-size $b --dtype bf16 $G --log-dir /tmp/logs/$label-$m-bs$b 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab-gpu$g.txt
}
runs() { local g=$1 m=$2 b=$3; shift 3; for l in "$@"; do one $g $l $m $b; done; }
gpu1() { for m in gpt2 bloom-560m; do for b in 16 4; do runs 1 $m $b F1 O1 O2 F2; done; done; runs 1 bloom-7b1 1 F1 O1 O2 F2; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
paste - - < $OUT/ab-gpu1.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab-gpu1.txt | head
cat $OUT/host.txt
