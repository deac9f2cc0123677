# gate-run82 (#37): the submitted code fa49aae (a927426 with the 16-bit tensor-core projections'
# kernel named by one function; no CUDA change): multi-smoke (both GPUs), then the kernels' GPU
# tests on GPU 0 while GPU 1 times the generation suite 128 + 128, bf16, every path, batch 16,
# inter-token p50 (the projections `linear` launches): N fa49aae, O a927426; N O.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16"
one() { # label model batch
  local label=$1 m=$2 bs=$3 bin=/tmp/bench
  case $label in O*) bin=/tmp/bench-old ;; esac
  echo "== $label $m bs$bs" >> $OUT/ab-gpu1.txt
  CUDA_VISIBLE_DEVICES=1 timeout 100 $bin --model $m --batch-size $bs $G --log-dir /tmp/ablogs/$label-$m-bs$bs 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab-gpu1.txt
}
gpu1() { for m in gpt2 bloom-560m; do for l in N1 O1; do one $l $m 16; done; done; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
paste - - < $OUT/ab-gpu1.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$4,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab-gpu1.txt | head
cat $OUT/host.txt
