# attn-prof61 (#37): 79b448f, one H100: where the batch-16 attention kernel's time goes, for the
# next session. ncu's full set with source counters (warp-stall samples by SASS instruction)
# for two launches of tb_decode_attention_head64_bf16 in gpt2 and bloom-560m batch-16 decode
# steps (prompt 128 + 16 new, the 25th and 26th launches: steps two and three), then each
# report's SASS with its samples as CSV.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
for m in gpt2 bloom-560m; do
  TB_CUDA_PROFILE=2 timeout 200 ncu --profile-from-start off --clock-control none --target-processes all \
    -k regex:tb_decode_attention_head --launch-skip 24 --launch-count 2 --set full --import-source no \
    -f -o /tmp/attn-$m /tmp/ab-bench --suite generation --prompt-lens 128 --new-tokens 16 --batch-size 16 --limit 1 \
    --min-time 0 --min-batches 0 --model $m --weights random --seed 0 --device cuda --dtype bf16 \
    --log-dir /tmp/prof-logs --no-progress > $OUT/attn-$m-run.txt 2>&1
  echo "$m exit $?" >> $OUT/attn-$m-run.txt
  ncu -i /tmp/attn-$m.ncu-rep --print-details all > $OUT/attn-$m-details.txt 2>&1
  ncu -i /tmp/attn-$m.ncu-rep --page source --csv --print-source sass --launch-count 1 > $OUT/attn-$m-sass.csv 2>&1
done
gzip -9 $OUT/*.csv
ls -la $OUT; grep -E "Duration|Warp Cycles Per Issued|Stall|Registers Per" $OUT/attn-gpt2-details.txt | head -20
