# gate-run121 (#37): d051d7c (to be submitted: the greedy pick's kernels load a thread's eight
# elements of its range before comparing them, instead of a rolled loop of a load then its
# comparison, and read the record's cursor before them) on a two-GPU host: multi-smoke (both
# GPUs), then the kernels' GPU tests on GPU 0 while GPU 1 times the generation suite 128 + 128,
# bf16, batch 1, inter-token p50: W every path on d051d7c, M every path on main's e80deb3 (its
# bench is d121337's: they differ in a test's doc comment); bloom-560m and gpt2 W M M W,
# gpt2-medium and bloom-1b7 W M, then W traced (CUPTI, scripts/kernel_timeline.py) for
# bloom-560m.
# The SASS (nvcc 13.0, sm_90a): tb_argmax_part_last_bf16 issues its 16 loads (8 logits, 8 of
# the ban) back to back before its first comparison; before, one 2-byte load an iteration.
# Predicted (before the call): tb_argmax_part_last's end_delta after the head 6.24 -> 3.3-4.0 us
# (bloom-560m; gpt2 5.54 -> 2.8-3.5): bloom-560m M 0.466 -> W 0.463-0.464; gpt2 0.175 ->
# 0.172-0.173; gpt2-medium 0.373 -> 0.370-0.371; bloom-1b7 1.183 -> 1.180-1.181.
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/bench.xz /tmp/bench; unxz .gpu/main.xz /tmp/main; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13
chmod +x /tmp/bench /tmp/main
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 b=/tmp/bench limit=10 env=""
  case $label in M*) b=/tmp/main ;; T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  CUDA_VISIBLE_DEVICES=1 env $env timeout 150 $b --fused all --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
gpu1() { for l in W1 M1 M2 W2; do one $l bloom-560m; done; for l in W1 M1 M2 W2; do one $l gpt2; done
  for l in W1 M1; do one $l gpt2-medium; done; for l in W1 M1; do one $l bloom-1b7; done; one T1 bloom-560m; }
gpu0() { CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic|dropped" $OUT/ab.txt | head
cat $OUT/host.txt
grep -E "^####|step span|between steps|tb_skinny_head|tb_argmax" $OUT/timelines.txt | head -20
