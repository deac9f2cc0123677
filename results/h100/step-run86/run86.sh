# step-run86 (#37): where the persistent decode step's weight copies start (experiment binary
# ab99ba7, branch step2-knobs over 70001fe; TB_STEP_FLAGS: 0 after the barrier before the stage
# (70001fe's), 1 after the stage's input is in shared memory, 2 with an evict_first L2 policy,
# 3 both). One H100: traces of flags 1 and 3 (bloom-560m, batch 1, an eager step); the generation
# suite 128 + 128, bf16, batch 1, inter-token p50, `--fused all,step` with each flag:
# bloom-560m 0 1 2 3 3 2 1 0, gpt2 0 1 2 3, and N (every path, graphed) once each.
export NCCL_NVLS_ENABLE=0
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench-knobs.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
T="--engine candle --weights random --seed 0 --device cuda --dtype bf16 --batch-size 1 --suite generation --prompt-lens 128 --new-tokens 32 --limit 2 --min-time 0 --min-batches 0 --no-progress"
mkdir -p /tmp/traces
for f in 1 3; do
  TB_STEP_FLAGS=$f TB_STEP_TRACE=/tmp/traces/trace-bloom-560m-f$f.bin timeout 100 /tmp/bench --fused all,step --model bloom-560m $T --log-dir /tmp/trace-logs > /tmp/traces/trace-f$f.txt 2>&1
  echo "# TB_STEP_FLAGS=$f" >> $OUT/trace-summary.txt
  python3 scripts/step_trace.py /tmp/traces/trace-bloom-560m-f$f.bin >> $OUT/trace-summary.txt 2>&1
done
(cd /tmp && tar czf $OUT/traces.tgz traces trace-logs)
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all,step flags=${1:1:1}
  case $label in N*) f=all; flags=0 ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  TB_STEP_FLAGS=$flags timeout 150 /tmp/bench --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in F0a F1a F2a F3a F3b F2b F1b F0b N; do one $l bloom-560m; done
for l in F0a F1a F2a F3a N; do one $l gpt2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
cat $OUT/trace-summary.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
