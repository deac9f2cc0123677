#!/usr/bin/env bash
# One batch of GPU-host checks per device call (see README "GPU runs").
# Run from the repo root on the GPU host; writes everything under $OUT.
#   bash scripts/gpu_checks.sh fixtures    HF reference fixtures (CPU fp32) for tests/fixtures
#   bash scripts/gpu_checks.sh lambada     124M-shape numerics check + full LAMBADA, 4 precisions
# Expects .gpu/ (git-ignored, carried): vocab/{encoder.json,vocab.bpe}, bench.gz, lambada_test.jsonl.
set -uo pipefail
stage=${1:?stage: fixtures|lambada}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  head -1 /proc/driver/nvidia/version
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} 2>&1 | tee "$OUT/host.txt"

case $stage in
fixtures)
  python3 scripts/make_fixtures.py --vocab-dir .gpu/vocab --data data/lambada_sample.jsonl \
    --out "$OUT/fixtures" --configs gpt2-fixture,gpt2-fixture-logits --device cpu --dtype fp32 \
    2>&1 | tee "$OUT/fixtures.log"
  (cd "$OUT" && tar czf fixtures.tgz fixtures && rm -rf fixtures)
  ;;
lambada)
  gunzip -c .gpu/bench.gz > /tmp/bench && chmod +x /tmp/bench
  B=/tmp/bench
  # 1. numerics: HF reference for the real 124M shape, made here (not committed), fp32 and bf16
  #    (same seed, so the same weights); ours in the same precision, and ours-bf16 vs HF-fp32.
  for dt in fp32 bf16; do
    python3 scripts/make_fixtures.py --vocab-dir .gpu/vocab --data data/lambada_sample.jsonl \
      --out /tmp/ref-$dt --configs gpt2 --device cuda --dtype $dt --n-passages 100 2>&1 | grep -v Writing
  done
  {
    $B verify --model-dir /tmp/ref-fp32/gpt2 --device cuda --dtype fp32
    $B verify --model-dir /tmp/ref-bf16/gpt2 --device cuda --dtype bf16
    echo "# ours in bf16 against the HF fp32 reference:"
    $B verify --model-dir /tmp/ref-fp32/gpt2 --device cuda --dtype bf16
  } 2>&1 | tee "$OUT/verify.txt"
  # 2. full LAMBADA (5153 passages), gpt2 124M shape, random weights, batch 16, 4 precisions.
  mkdir -p /tmp/logs
  for dt in fp32 tf32 bf16 fp16; do
    $B --suite lambada --model gpt2 --weights random --seed 0 --device cuda --dtype $dt \
      --batch-size 16 --data .gpu/lambada_test.jsonl --log-dir /tmp/logs 2>&1 | tee -a "$OUT/lambada.txt"
  done
  (cd /tmp && tar czf "$OUT/logs.tgz" logs)
  ;;
esac
