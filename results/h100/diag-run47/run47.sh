# diag-run47 (#37): d2e568a on one H100: bloom-560m at batch 4 (slower than f0e828e on 2x H200,
# gate-run46), generation suite 128 + 128, bf16. Arms: F every path; C every path but cluster;
# I every path but step-io; N neither; O f0e828e every path. F C I N O O N I C F.
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
  timeout 150 $bin --model $m --batch-size 4 --dtype bf16 $G "${flags[@]}" --log-dir /tmp/logs/$label-$m-bs4 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt
}
for l in F1 C1 I1 N1 O1 O2 N2 I2 C2 F2; do one $l bloom-560m; done
(cd /tmp && tar czf $OUT/ab-logs.tgz logs)
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
cat $OUT/host.txt
