# knob-run1 (#37): experiment binary 1852362 (exp-knobs: env knobs over main's f0e828e), one H100.
# The generation suite 128 + 128 at batch 1, bf16, every path (`all`), arms by env:
#   F none; H TB_HEAD_PAIRS=1 (the block-a-head attention kernel at batch 1, no merge);
#   W H with TB_HEAD_WIDE=1 (its 16-warp form); G TB_HEAD_MIN_ROW_BYTES=2048 (bloom-560m's head
#   through the GEMV); L TB_FOLD_ROW_BYTES=8192 (bloom-7b1 folds its norms). Then a read-bandwidth probe.
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model
  local label=$1 m=$2 env=()
  case $label in
    H*) env=(TB_HEAD_PAIRS=1) ;;
    W*) env=(TB_HEAD_PAIRS=1 TB_HEAD_WIDE=1) ;;
    G*) env=(TB_HEAD_MIN_ROW_BYTES=2048) ;;
    L*) env=(TB_FOLD_ROW_BYTES=8192) ;;
  esac
  echo "== $label $m ${env[*]}" >> $OUT/ab.txt
  env "${env[@]}" timeout 150 /tmp/ab-bench --model $m --batch-size 1 --dtype bf16 $G --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab.txt
}
runs() { local m=$1; shift; for l in "$@"; do one $l $m; done; }
runs gpt2 F1 H1 W1 W2 H2 F2
runs bloom-560m F1 H1 W1 G1 G2 W2 H2 F2
runs bloom-7b1 F1 L1 H1 W1 W2 H2 L2 F2
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
python3 scripts/probes/read_bw.py > $OUT/read-bw.txt 2>&1
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
cat $OUT/read-bw.txt
