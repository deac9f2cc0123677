# mlp-run97 (#37): --fused mlp-row (opt-in; branch mlp-row, db02502): a one-row decode MLP as one
# kernel, fc2's partial sums added into an f32 residual stream by atomics. On one H200 (no H100
# kind lent). The new GPU tests with the decode, norm-fold, norm-stats, step-io and pdl tests; then
# the generation suite 128 + 128, bf16, batch 1, inter-token p50: N every path (all), M all,mlp-row;
# bloom-560m and gpt2 each N M M N.
export NCCL_NVLS_ENABLE=0
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
KERNEL_FILTER="gpu_tests::mlp_row gpu_tests::pdl gpu_tests::norm_fold gpu_tests::decode gpu_tests::norm_stats gpu_tests::step_io" timeout 270 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all
  case $label in M*) f=all,mlp-row ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 100 /tmp/bench --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in N1 M1 M2 N2; do one $l bloom-560m; done
for l in N1 M1 M2 N2; do one $l gpt2; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked|failed|rel " $OUT/kernels.txt | head -30
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
