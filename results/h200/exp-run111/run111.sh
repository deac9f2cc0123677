# exp-run111 (#37): two next steps after gate-run110, one H200, one experiment binary 3182127
# (branch attn-early: main's 9f5d47c kernels + knobs): A, TB_ATTN_EARLY=1, the cluster decode
# attention loads its split's cached keys and values (positions up to the cache's size, the
# new one replaced from qkv after the wait) before griddepcontrol.wait; B, TB_FC2_HALF=1, fc2
# (K 4096) as two warps a column, 256 blocks, instead of 1024 (so that qkv launches earlier).
# Generation suite 128 + 128, bf16, batch 1, `--fused all`, 10 prompts, ITL p50.
# Predicted (before the call): A -10 to -30 us a step on bloom-560m (0.4-1.2 a layer), gpt2 -5
# to -15; B -5 to -25 (qkv's lead 2 -> 4+ us, fc2 itself +0.5); A+B the sum.
export NCCL_NVLS_ENABLE=0
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/exp.xz /tmp/exp; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13; chmod +x /tmp/exp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1 --fused all"
one() { local label=$1 m=$2 a=0 b=0 limit=10 env=""
  case $label in *A*) a=1 ;; esac; case $label in *B*) b=1 ;; esac
  case $label in T*) limit=4; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env $env TB_ATTN_EARLY=$a TB_FC2_HALF=$b timeout 150 /tmp/exp --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
for l in N1 A1 B1 AB1 AB2 B2 A2 N2; do one $l bloom-560m; done
for l in N1 A1 B1 AB1; do one $l gpt2; done
one TAB bloom-560m
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
grep -A12 'one layer' $OUT/timelines.txt
