# ln1-run1 (#37): experiment binary b4481f3 (exp-ln1, not merged): the one-row folded-norm GEMV
# (norm-fold) at three launch bounds, TB_LN1 unset (128, 16: 32 registers), b12 (40), b8 (55);
# S = every path but norm-fold. bloom-7b1 bf16 batch 1, generation 128 + 128, both GPUs, mirrored
# orders; GPU 0 then gpt2 and bloom-560m, default against b8.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/bench-exp.xz'),open('/tmp/ab-bench','wb'))"; chmod +x /tmp/ab-bench
BASE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
BASE=$BASE,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
BASE=$BASE,early-weights,gemv-head,trigger-first
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
runs() { local g=$1 m=$2; shift 2; for l in "$@"; do one $g $l $m; done; }
# TB_LN1= (empty) would name tb_gemv_ln1_bf16's neighbour: unset it for the default arm.
one() { # gpu label model
  local g=$1 label=$2 m=$3 flags=() env=(env -u TB_LN1)
  case $label in S*) flags=(--fused $BASE) ;; B12*) env=(env TB_LN1=b12) ;; B8*) env=(env TB_LN1=b8) ;; esac
  echo "== $label $m" >> $OUT/ab-gpu$g.txt
  CUDA_VISIBLE_DEVICES=$g "${env[@]}" timeout 150 /tmp/ab-bench --model $m --batch-size 1 --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/gpu$g-$label-$m 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/ab-gpu$g.txt
}
gpu1() { runs 1 bloom-7b1 S1 F1 B12a B8a B8b B12b F2 S2; }
gpu0() { runs 0 bloom-7b1 B8a B12a F1 S1 S2 F2 B12b B8b; for m in gpt2 bloom-560m; do runs 0 $m F1 B8a B8b F2; done; }
gpu0 & gpu1 & wait
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
for g in 1 0; do echo "-- GPU $g"; paste - - < $OUT/ab-gpu$g.txt | awk '{print $2,$3,$7}'; done
