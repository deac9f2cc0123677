# exp-run115 (#37): one H200, experiment binary e860ab1 (branch late-knob: cf-tf's 5aea2d4 + the
# knob TB_LATE=<roles>, the wide kernel of each role (qkv, proj, fc, fc2: told by its shape)
# letting the next kernel launch only after its wait). Generation suite 128 + 128, bf16, batch 1,
# 6 prompts, ITL p50. Arms: P every path but trigger-first (the attention lets proj launch after
# its wait: what main's 5216d27 does), A every path (the attention lets proj launch first:
# gate-run114's W, gpt2 +28 us), Q A with qkv late, F2 A with fc2 late, G A with fc late;
# bloom-560m and gpt2 P A Q F2 G G F2 Q A P; then Q and F2 traced on bloom-560m.
# Why: gate-run114's A let every stage launch ahead without bound (gpt2 +28 us; traced, slowed
# at each kernel's start, it was faster). One kernel a layer launching its next only after its
# wait bounds how far ahead they run, while proj and fc still launch a stage earlier than P.
# Predicted (before the call): Q bloom-560m 0.450-0.462 (P 0.467), gpt2 0.168-0.176 (P 0.175,
# A 0.203); F2 0.455-0.465, gpt2 0.170-0.178; G 0.465-0.480 (fc2 loses its lead).
export NCCL_NVLS_ENABLE=0
unxz() { python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" $1 $2; }
unxz .gpu/exp.xz /tmp/exp; unxz .gpu/libcupti.so.13.xz .gpu/libcupti.so.13; chmod +x /tmp/exp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
NOTF=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,norm-fold,cluster,step-io,norm-stats,skinny-fold,gemv-wide,cache-first
G="--suite generation --prompt-lens 128 --new-tokens 128 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all late="" limit=6 env=""
  case $label in P*) f=$NOTF ;; Q*|TQ*) late=qkv ;; F2*|TF2*) late=fc2 ;; G*) late=fc ;; esac
  case $label in T*) limit=3; env="CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/tr/$label-$m.csv" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env $env TB_LATE=$late timeout 120 /tmp/exp --fused $f --model $m $G --limit $limit --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note|dropped" >> $OUT/ab.txt
  if [ -n "$env" ]; then echo "#### $label $m" >> $OUT/timelines.txt; python3 scripts/kernel_timeline.py /tmp/tr/$label-$m.csv >> $OUT/timelines.txt 2>&1; fi; }
mkdir -p /tmp/tr
for m in bloom-560m gpt2; do for l in P1 A1 Q1 F21 G1 G2 F22 Q2 A2 P2; do one $l $m; done; done
one TQ bloom-560m; one TF2 bloom-560m
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
awk '/^== /{l=$2" "$3} /p50/{for(i=1;i<=NF;i++) if($i=="p50") print l, $(i+1)}' $OUT/ab.txt
grep -E "note|rror|panic" $OUT/ab.txt | head
cat $OUT/host.txt
grep -A8 'one layer' $OUT/timelines.txt
