# check-run116 (#37): one H200, the final binaries of this session's submission (e80deb3: the
# kernels of 5216d27, gated in gate-run113, plus comments; its test binary has the cluster test
# moved to gpu_tests/cluster.rs and the PTX check's control-flow rule in a function): the
# kernels' GPU tests, then bloom-560m and gpt2 every path (generation 128 + 128, bf16, batch 1,
# 6 prompts), then gpt2 traced with every path on e80deb3 (P) and on cf-tf's 5aea2d4 (A: the
# attention letting proj launch first; gpt2 +18 to +28 us in gate-run114 / exp-run115).
# Predicted (before the call): tests 81 / 0 / 3; bloom-560m 0.466-0.472, gpt2 0.175-0.180 (the
# host decides within that); the traces: A's gpt2 layer longer than P's by 1.5-2.5 us.
export NCCL_NVLS_ENABLE=0
CUDA_VISIBLE_DEVICES=0 timeout 110 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/tf.xz /tmp/tf; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13; chmod +x /tmp/bench /tmp/tf
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1 --fused all"
one() { local label=$1 m=$2 b=/tmp/bench limit=6 env=""
  case $label in TA*) b=/tmp/tf ;; esac
  case $label in T*) limit=3; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env $env timeout 40 $b --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
one W1 bloom-560m; one W1 gpt2; one TP gpt2; one TA gpt2
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
cat $OUT/host.txt
grep -B1 -A8 'one layer' $OUT/timelines.txt
