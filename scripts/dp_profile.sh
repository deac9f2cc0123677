#!/usr/bin/env bash
# #34: where data parallelism's extra step time goes: nsys over gpt2 bf16 8 x 1024 fine-tuning
# (dropout off, 3 warm-up + $PROF_STEPS (10) steps) at --dp 1 and --dp 2 (the ranks followed
# through their fork), GPU kernel and CUDA API summaries -> $OUT/dp-profile-dp{1,2}.txt.
# Needs .gpu/bench.xz, .gpu/wikitext-2-raw (wiki.test.raw may be a copy of wiki.valid.raw).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' .gpu/bench.xz /tmp/bench
chmod +x /tmp/bench
command -v nsys > /dev/null || { echo "no nsys on this host" >&2; exit 1; }
W=(--weights random --seed 0 --device cuda --dtype bf16 --suite wikitext2 --model gpt2 --data .gpu/wikitext-2-raw
   --batch-size 8 --block-size 1024 --no-dropout --warmup 3 --max-steps $(( ${PROF_STEPS:-10} + 3 )) --no-progress)
for dp in 1 2; do
  nsys profile --trace=cuda,nvtx --trace-fork-before-exec=true --force-overwrite=true -o /tmp/dp$dp \
    /tmp/bench "${W[@]}" --dp $dp --log-dir /tmp/dp-prof-logs 2>&1 | grep -E "step latency|tokens/s|rror" | tee -a "$OUT/dp-profile.txt"
  nsys stats --report cuda_gpu_kern_sum,cuda_api_sum --format table /tmp/dp$dp.nsys-rep > "$OUT/dp-profile-dp$dp.txt" 2>&1
done
