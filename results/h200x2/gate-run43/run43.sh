# gate-run43 (#37): 752452d, the submitted source: as gate-run42's a4ea7bd, the norms folded by the
# engine at its first one-row generation (CausalLm::fold_norms) instead of at every decode layout,
# and a GPU test with random LayerNorm weights and biases: multi-smoke (both GPUs), then the
# kernels' GPU tests on GPU 0 while GPU 1 times the generation suite 128 + 128 at batch 1, F every
# path against S every path but norm-fold, F S S F for gpt2 and bloom-560m, F S for bloom-7b1
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_checks.sh multi-smoke > $OUT/multi-smoke.txt 2>&1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
BASE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
BASE=$BASE,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
BASE=$BASE,early-weights,gemv-head,trigger-first
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # gpu label model bs dtype
  local g=$1 label=$2 m=$3 b=$4 d=$5 flags=()
  case $label in S*) flags=(--fused $BASE) ;; esac
  echo "== $label $m bs$b $d" >> $OUT/ab-gpu$g.txt
  CUDA_VISIBLE_DEVICES=$g timeout 150 /tmp/ab-bench --model $m --batch-size $b --dtype $d $G "${flags[@]}" --log-dir /tmp/logs/$label-$m-bs$b-$d 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$g.txt
}
runs() { local g=$1 m=$2 b=$3 d=$4; shift 4; for l in "$@"; do one $g $l $m $b $d; done; }
gpu1() { for m in gpt2 bloom-560m; do runs 1 $m 1 bf16 F1 S1 S2 F2; done; runs 1 bloom-7b1 1 bf16 F1 S1; }
gpu0() {
  CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
}
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
tail -1 $OUT/multi-smoke.txt
for g in 1 0; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$4,$5,$9}'; done
