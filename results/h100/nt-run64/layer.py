# The last decode step's layers from each ncu CSV of prof.tgz: each of a layer's five kernels
# averaged over the layers (µs), the layer's sum, and the kernels after the layers.
import csv, collections, glob, sys, tarfile, io
t = tarfile.open(sys.argv[1])
for m in sorted(t.getmembers(), key=lambda m: m.name):
    if not m.name.endswith('.csv'): continue
    rows = [r for r in csv.reader(l for l in io.TextIOWrapper(t.extractfile(m)) if not l.startswith('=='))]
    h = rows[0]; ni, ti, gi = h.index('Kernel Name'), h.index('gpu__time_duration.sum'), h.index('Grid Size')
    seq = []
    for r in rows[1:]:
        try: seq.append((r[ni], r[gi], float(r[ti].replace(',', ''))))
        except ValueError: pass
    end = max(i for i, (n, g, _) in enumerate(seq) if 'layer_norm_fwd' in n)  # the final norm
    nl = 24 if 'bloom' in m.name or 'medium' in m.name else 12
    layer = seq[end - 5 * nl:end]
    agg = collections.defaultdict(list)
    for j, (n, g, v) in enumerate(layer): agg[(j % 5, n, g)].append(v)
    print(f"## {m.name.split('/')[-1]}: a layer {sum(v for *_, v in layer) / nl / 1000:.2f} µs; then " +
          ', '.join(f"{n} {v / 1000:.1f}" for n, g, v in seq[end:end + 3]))
    for (k, n, g), v in sorted(agg.items()):
        print(f"  {k} {n} {g} {sum(v) / len(v) / 1000:.2f}")
