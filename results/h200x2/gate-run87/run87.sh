# gate-run87 (#37): the submitted step kernel 679e3ab (branch step2: `--fused step`'s copies off
# the barrier's thread and after each stage's input, evict_first; loads first; L2 prefetches; no
# spills) on a two-GPU host: multi-smoke (both GPUs), then the kernels' GPU tests on GPU 0 while
# GPU 1 takes a step trace (bloom-560m, batch 1, an eager step) and times the generation suite
# 128 + 128, bf16, batch 1, inter-token p50: S 679e3ab all,step, P fa49aae all,step, N 679e3ab
# every path (graphed), O fa49aae every path; bloom-560m S P N O O N P S, gpt2 S P N O.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
for b in bench bench-old; do python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/$b.xz /tmp/$b; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
T="--engine candle --weights random --seed 0 --device cuda --dtype bf16 --batch-size 1 --suite generation --prompt-lens 128 --new-tokens 32 --limit 2 --min-time 0 --min-batches 0 --no-progress"
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 bin=/tmp/bench f=all,step
  case $label in P*|O*) bin=/tmp/bench-old ;; esac
  case $label in N*|O*) f=all ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 timeout 150 $bin --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
gpu1() {
  mkdir -p /tmp/traces
  CUDA_VISIBLE_DEVICES=1 TB_STEP_TRACE=/tmp/traces/trace-bloom-560m.bin timeout 100 /tmp/bench --fused all,step --model bloom-560m $T --log-dir /tmp/trace-logs > /tmp/traces/trace-bloom-560m.txt 2>&1
  python3 scripts/step_trace.py /tmp/traces/trace-bloom-560m.bin > $OUT/trace-summary.txt 2>&1
  (cd /tmp && tar czf $OUT/traces.tgz traces trace-logs)
  for l in S1 P1 N1 O1 O2 N2 P2 S2; do one $l bloom-560m; done
  for l in S1 P1 N1 O1; do one $l gpt2; done
}
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
cat $OUT/trace-summary.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
