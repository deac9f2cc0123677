# ablate1: decode kernels skipped (TB_ABLATE) on GPU 0; bf16 GEMV block shapes (TB_GEMV_SWEEP) on GPU 1
export NCCL_NVLS_ENABLE=0
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open(".gpu/bench.xz"),open("/tmp/bench","wb"))'; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/host.txt
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --dtype bf16 --no-progress --engine candle"
one() { # file label env... -- args
  local f=$1 label=$2; shift 2
  local t0=$(date +%s.%N)
  echo "== $label" >> $OUT/$f
  env "$@" 2>&1 | grep -E "inter-token|rror|panic" >> $OUT/$f
  echo "   wall $(awk "BEGIN{print $(date +%s.%N) - $t0}")" >> $OUT/$f
}
ablate() {
  for m in gpt2 bloom-560m bloom-7b1; do
    for a in none norm attn combine gemv none; do
      one ablate.txt "$m bs1 $a" CUDA_VISIBLE_DEVICES=0 TB_ABLATE=$a timeout 60 /tmp/bench --model $m --batch-size 1 $G --log-dir /tmp/logs/ablate/$m-bs1-$a
    done
  done
  for m in gpt2 bloom-560m; do
    for a in none norm attn combine; do
      one ablate.txt "$m bs16 $a" CUDA_VISIBLE_DEVICES=0 TB_ABLATE=$a timeout 60 /tmp/bench --model $m --batch-size 16 $G --log-dir /tmp/logs/ablate/$m-bs16-$a
    done
  done
}
sweep() {
  for v in default w2s4 w1s4 w1s8 w2s8 w4s4 w4s2 w2s2 default x2s4 x4s4 x2s8 x4s8 x8s4 default; do
    one sweep.txt "bloom-7b1 $v" CUDA_VISIBLE_DEVICES=1 TB_GEMV_SWEEP=$v timeout 60 /tmp/bench --model bloom-7b1 --batch-size 1 $G --log-dir /tmp/logs/sweep/7b1-$v
  done
  for v in default w1s4 w4s4 x2s4 x4s4 default; do
    one sweep.txt "bloom-560m $v" CUDA_VISIBLE_DEVICES=1 TB_GEMV_SWEEP=$v timeout 60 /tmp/bench --model bloom-560m --batch-size 1 $G --log-dir /tmp/logs/sweep/560m-$v
  done
}
ablate & sweep & wait
(cd /tmp && tar czf $OUT/logs.tgz logs)
cat $OUT/ablate.txt $OUT/sweep.txt
