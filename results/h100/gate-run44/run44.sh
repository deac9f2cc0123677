# gate-run44 (#37): 1477d8f on one H100: the kernels' GPU tests, then the generation suite
# 128 + 128 at batch 1, bf16. Arms: F every path; N every path but cluster and step-io (the
# split kernel's loads first alone); O f0e828e's binary, every path (the kernels before); C
# every path but cluster; I every path but step-io. F N O O N F, then C I once each.
bash scripts/gpu_checks.sh kernels > /dev/null 2>&1
for b in bench bench-old; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu/$b.xz'),open('/tmp/$b','wb'))"; chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
BASE=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash
BASE=$BASE,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl
BASE=$BASE,early-weights,gemv-head,trigger-first,norm-fold
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle"
one() { # label model
  local label=$1 m=$2 bin=/tmp/bench flags=()
  case $label in
    N*) flags=(--fused $BASE) ;;
    O*) bin=/tmp/bench-old ;;
    C*) flags=(--fused $BASE,step-io) ;;
    I*) flags=(--fused $BASE,cluster) ;;
  esac
  echo "== $label $m" >> $OUT/ab.txt
  timeout 150 $bin --model $m --batch-size 1 --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
runs() { local m=$1; shift; for l in "$@"; do one $l $m; done; }
for m in gpt2 bloom-560m bloom-7b1; do runs $m F1 N1 O1 O2 N2 F2 C1 I1; done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
grep -E "test result|FAILED|panicked|failed" $OUT/kernels.txt | head -20
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head
