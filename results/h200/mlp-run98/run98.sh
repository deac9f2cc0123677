# mlp-run98 (#37): why --fused mlp-row was slower in mlp-run97 (bloom-560m 0.589 -> 0.661 ms).
# Experiment binary 2a4165a (branch mlp-row-diag: db02502 + knobs), one H200. First ncu, each
# kernel alone (caches flushed, serialized): durations and DRAM throughput of the step's GEMVs
# and tb_mlp1, eager... graphed steps of bloom-560m, one generation call, with and without
# mlp-row. Then the generation suite 128 + 128, bf16, batch 1, inter-token p50, bloom-560m:
# N all; M all,mlp-row; D1 M with no atomics (block 0 stores; wrong outputs); D2 M with no weight
# copies (wrong outputs); D4 M with the copies after the wait; C16 / C8 M with 16 / 8 columns a
# block (256 / 512 blocks); K M with a 100 % shared-memory carveout on tb_mlp1 and proj's GEMV.
export NCCL_NVLS_ENABLE=0
python3 -c "import lzma,shutil,sys;shutil.copyfileobj(lzma.open(sys.argv[1]),open(sys.argv[2],'wb'))" .gpu/bench.xz /tmp/bench; chmod +x /tmp/bench
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
P="--suite generation --prompt-lens 128 --new-tokens 8 --limit 2 --min-time 0 --min-batches 0 --model bloom-560m --weights random --seed 0 --device cuda --dtype bf16 --batch-size 1 --no-progress"
for f in all all,mlp-row; do
  TB_CUDA_PROFILE=1 timeout 150 ncu --profile-from-start off --clock-control none --target-processes all \
    -k regex:"tb_mlp1|tb_gemv|tb_decode_attention" --launch-skip 60 --launch-count 60 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size \
    --csv /tmp/bench --fused $f $P --log-dir /tmp/prof-logs > /tmp/ncu-$f.csv 2>/tmp/ncu-$f.err
  echo "== $f exit $?" >> $OUT/ncu.txt
  python3 - /tmp/ncu-$f.csv >> $OUT/ncu.txt <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; rows = rows[1:]
ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
agg = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    try: agg[r[ki]][r[mi]].append(float(r[vi].replace(",", "")))
    except ValueError: pass
for k, m in agg.items():
    print(k[:40], {n: round(sorted(v)[len(v)//2], 2) for n, v in m.items()}, "n", len(m.get("gpu__time_duration.sum", [])))
PY
  tail -3 /tmp/ncu-$f.err >> $OUT/ncu.txt
done
G="--suite generation --prompt-lens 128 --new-tokens 128 --limit 10 --weights random --seed 0 --device cuda --no-progress --engine candle --dtype bf16 --batch-size 1"
one() { local label=$1 m=$2 f=all,mlp-row env=""
  case $label in N*) f=all ;; D1) env="TB_MLP_DIAG=1" ;; D2) env="TB_MLP_DIAG=2" ;; D4) env="TB_MLP_DIAG=4" ;;
    C16) env="TB_MLP_CB=16" ;; C8) env="TB_MLP_CB=8" ;; K) env="TB_MLP_CARVE=100" ;; esac
  echo "== $label $m" >> $OUT/ab.txt
  env $env timeout 100 /tmp/bench --fused $f --model $m $G --log-dir /tmp/ablogs/$label-$m 2>&1 | grep -E "inter-token|rror|panic|note" >> $OUT/ab.txt; }
for l in N1 M1 D1 D2 D4 C16 C8 K M2 N2; do one $l bloom-560m; done
(cd /tmp && tar czf $OUT/ab-logs.tgz ablogs)
cat $OUT/ncu.txt
paste - - < $OUT/ab.txt | awk '{for(i=1;i<=NF;i++) if($i=="p50") print $2,$3,$(i+1)}'
grep -E "note|rror|panic" $OUT/ab.txt | head; cat $OUT/host.txt
