# gate-run89 (#37): 0ea6615 (branch step3: `--fused step`'s biases staged in shared memory at the
# start, the residual's columns kept there between proj and fc2) on a two-GPU host: multi-smoke
# (both GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times the generation suite
# 128 + 128, bf16, batch 1, inter-token p50: S 0ea6615 all,step, P 679e3ab all,step, N 0ea6615
# every path; bloom-560m S P P S N, gpt2 S P.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench f=all,step
  case $label in P*) bin=/tmp/bench-old ;; N*) f=all ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 timeout 120 $bin --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
gpu1() { for l in S1 P1 P2 S2 N1; do one $l bloom-560m; done; for l in S1 P1; do one $l gpt2; done; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
