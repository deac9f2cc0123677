# gemv-run100 (#37): one-row GEMV stages chained in a graph with programmatic edges, a block a
# column (gemv.cu's layout) against a few wide blocks, bloom-560m's proj / fc / fc2 shapes, on one
# H200 (no H100 kind lent): scripts/probes/gemv_grid_probe.cu (nvcc 13, -arch=sm_90, cudart
# static), twice; exchange_probe once more beside it.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/host.txt
chmod +x .gpu/*_probe
for r in 1 2; do echo "== run $r" >> $OUT/probe.txt; timeout 200 .gpu/gemv_grid_probe >> $OUT/probe.txt 2>&1; done
echo "== exchange" >> $OUT/probe.txt; timeout 60 .gpu/exchange_probe >> $OUT/probe.txt 2>&1
cat $OUT/probe.txt; cat $OUT/host.txt
