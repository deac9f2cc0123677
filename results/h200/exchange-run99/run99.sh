# exchange-run99 (#37): what one hand-off of a decode step's activations between SMs costs at best
# on one H200 (no H100 kind lent): scripts/probes/exchange_probe.cu (built here with nvcc 13,
# -arch=sm_90, cudart static), three times.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
chmod +x .gpu/exchange_probe
for r in 1 2 3; do echo "== run $r" >> $OUT/probe.txt; timeout 120 .gpu/exchange_probe >> $OUT/probe.txt 2>&1; done
cat $OUT/probe.txt; cat $OUT/host.txt
