# head-run78 (#37): experiment binary 5525689 (branch exp-head) on one H100. The new kernel's
# GPU test first; then the generation suite 128 + 128, bf16, every path, batch 1, inter-token
# p50: B no knob (cuBLAS's head for bloom-560m, the skinny one-row head for gpt2); H<c>b<k>
# TB_HEAD_ROWS=c TB_HEAD_BLOCKS=k (tb_head_rows, c rows a warp, k blocks an SM, 0 a block a
# row group); S TB_HEAD_SKINNY=1 (bloom's head through the skinny kernel). Mirrored order.
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
KERNEL_FILTER="gpu_tests::matmul::head_rows gpu_tests::matmul::gemv" bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2; shift 2; echo "== $label $m $*" >> $OUT/ab.txt
  env "$@" timeout 150 /tmp/bench --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
m=bloom-560m
one B1 $m; one H4b4a $m TB_HEAD_ROWS=4; one H2b4a $m TB_HEAD_ROWS=2; one H8b4a $m TB_HEAD_ROWS=8
one H4b0a $m TB_HEAD_ROWS=4 TB_HEAD_BLOCKS=0; one H4b2a $m TB_HEAD_ROWS=4 TB_HEAD_BLOCKS=2; one Sa $m TB_HEAD_SKINNY=1
one Sb $m TB_HEAD_SKINNY=1; one H4b2b $m TB_HEAD_ROWS=4 TB_HEAD_BLOCKS=2; one H4b0b $m TB_HEAD_ROWS=4 TB_HEAD_BLOCKS=0
one H8b4b $m TB_HEAD_ROWS=8; one H2b4b $m TB_HEAD_ROWS=2; one H4b4b $m TB_HEAD_ROWS=4; one B2 $m
m=gpt2
one B1 $m; one H4b4a $m TB_HEAD_ROWS=4; one H4b0a $m TB_HEAD_ROWS=4 TB_HEAD_BLOCKS=0
one H4b0b $m TB_HEAD_ROWS=4 TB_HEAD_BLOCKS=0; one H4b4b $m TB_HEAD_ROWS=4; one B2 $m
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
grep -E "test result|FAILED|panicked" $OUT/kernels.txt | head
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
