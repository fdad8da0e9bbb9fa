# The kernels of one decode step from an Nsight Compute CSV of `kernels decode-profile`
# (benches/kernels.rs): ncu --metrics gpu__time_duration.sum --clock-control none --csv
# --log-file ncu.csv kernels decode-profile; python3 eval/ncu_step.py ncu.csv. The step runs from
# after one output-head product (the longest launch) to the next; durations summed per kernel.
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
hdr = rows[hdr_i]; data = rows[hdr_i+1:]
ki, vi, gi, bi = hdr.index('Kernel Name'), hdr.index('Metric Value'), hdr.index('Grid Size'), hdr.index('Block Size')
k = [(r[ki].split('(')[0], float(r[vi].replace(',', '')), r[gi], r[bi]) for r in data if len(r) > vi and r[vi]]
# The output head (73448 rows of 4096) is the longest quantized product, once per step: its kernel and grid
# (those with the longest median launch: one launch may be slow for other reasons) mark the steps.
groups = collections.defaultdict(list)
for x in k:
    if 'qm' in x[0]:
        groups[(x[0], x[2])].append(x[1])
longest = max(groups, key=lambda g: sorted(groups[g])[len(groups[g]) // 2])
longest = (longest[0], 0.0, longest[1])
heads = [i for i, x in enumerate(k) if (x[0], x[2]) == (longest[0], longest[2])]
print('head launches at', heads)
a, b = heads[-2], heads[-1]
step = k[a+1:b+1]
print('kernels in one decode step', len(step), 'sum of durations us', round(sum(x[1] for x in step)/1e3, 1))
agg = collections.defaultdict(lambda: [0, 0.0])
for name, ns, g, bl in step:
    key = name.replace('void ', '')[:70] + ' ' + g
    agg[key][0] += 1; agg[key][1] += ns
tot = sum(x[1] for x in step)
for key, (c, ns) in sorted(agg.items(), key=lambda x: -x[1][1])[:45]:
    print(f'{c:4d} {ns/1e3:8.1f} us {100*ns/tot:5.1f}%  avg {ns/c/1e3:6.1f}  {key}')
