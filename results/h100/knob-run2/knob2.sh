# knob-run2 (#37): experiment binary cb0faf3 (exp-knobs over main's f0e828e), one H100.
# First the kernels' GPU tests with TB_FOLD_C2=1 TB_ATTN_EARLY=1 (the two new kernels in place
# of the old ones wherever they apply). Then the generation suite 128 + 128 at batch 1, bf16,
# every path (`all`), arms by env:
#   F none; E TB_ATTN_EARLY=1 (the split attention's loads before q, no barrier first);
#   C TB_FOLD_C2=1 (the one-row folded GEMV two columns a block, statistics by the first's warps);
#   A TB_SKIP_ATTN=1, M TB_SKIP_COMBINE=1 (diagnostics: the attention's kernels, or its merge, not
#   launched; outputs garbage, times only); L TB_FOLD_ROW_BYTES=8192 (bloom-7b1 folds), with C, E.
export TB_UNUSED=0
TB_FOLD_C2=1 TB_ATTN_EARLY=1 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model
  local label=$1 m=$2 env=(TB_UNUSED=0)
  case $label in
    E*) env=(TB_ATTN_EARLY=1) ;;
    C*) env=(TB_FOLD_C2=1) ;;
    A*) env=(TB_SKIP_ATTN=1) ;;
    M*) env=(TB_SKIP_COMBINE=1) ;;
    LCE*) env=(TB_FOLD_ROW_BYTES=8192 TB_FOLD_C2=1 TB_ATTN_EARLY=1) ;;
    LC*) env=(TB_FOLD_ROW_BYTES=8192 TB_FOLD_C2=1) ;;
    LE*) env=(TB_FOLD_ROW_BYTES=8192 TB_ATTN_EARLY=1) ;;
  esac
  echo "== $label $m ${env[*]}" >> $OUT/ab.txt
  env "${env[@]}" timeout 150 /tmp/ab-bench --model $m --batch-size 1 --dtype bf16 $G --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab.txt
}
runs() { local m=$1; shift; for l in "$@"; do one $l $m; done; }
runs gpt2 F1 E1 C1 A1 M1 C2 E2 F2
runs bloom-560m F1 E1 C1 A1 M1 C2 E2 F2
runs bloom-7b1 F1 LC1 LE1 LCE1 A1 M1 LCE2 LE2 LC2 F2
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
