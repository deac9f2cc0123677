# ft-run1 (one H100, 07544ed): candle against HF's best, LAMBADA --mode generate, batch 16
# (scripts/hf_remeasure.sh); part A: bloom-7b1 (first 320) and gpt2 at pad 1; part B: bloom-560m
# at pad 1, gpt2 and bloom-560m at pad 64; part C: fp8 accuracy (scripts/gpu_checks.sh fp8, accuracy part)
export NCCL_NVLS_ENABLE=0
rem() { timeout "$@" > /dev/null 2>&1; pkill -f /tmp/bench; sleep 1; }
case $1 in
A) GEN_LIMIT=320 rem 260 bash scripts/hf_remeasure.sh ft:bloom-7b1
   rem 150 bash scripts/hf_remeasure.sh ft:gpt2 ;;
B) GEN_LIMIT=320 rem 200 bash scripts/hf_remeasure.sh ft:bloom-7b1
   rem 150 bash scripts/hf_remeasure.sh ft:bloom-560m
   [ -n "${PAD64:-}" ] && PAD=64 rem 150 bash scripts/hf_remeasure.sh ft:gpt2
   [ -n "${PAD64:-}" ] && PAD=64 rem 150 bash scripts/hf_remeasure.sh ft:bloom-560m ;;
C) FP8_PARTS=accuracy timeout 400 bash scripts/gpu_checks.sh fp8 > $OUT/fp8-console.txt 2>&1
   grep -E "^---|perplexity|identical|exit" $OUT/fp8.txt ;;
esac
[ -f $OUT/remeasure.txt ] && grep -E "^---|samples/s|identical|hf ran|exit" $OUT/remeasure.txt
