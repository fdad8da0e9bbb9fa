# The kernels of one decode step from an Nsight Compute CSV of `kernels decode-profile`
# (benches/kernels.rs): ncu --metrics gpu__time_duration.sum --clock-control none --csv
# --log-file ncu.csv kernels decode-profile; python3 eval/ncu_step.py ncu.csv[.xz]. The step runs
# from after one output-head product to the next; durations summed per kernel. eval/kernel_shares.py
# reads the step through one_step().
import collections, csv, io, lzma, sys


def launches(path):
    """Every profiled launch in order: (kernel name, duration in ns, grid)."""
    text = lzma.open(path, 'rt').read() if path.endswith('.xz') else open(path).read()
    rows = list(csv.reader(io.StringIO(text)))
    hdr_i = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
    hdr = rows[hdr_i]
    ki, vi, gi = hdr.index('Kernel Name'), hdr.index('Metric Value'), hdr.index('Grid Size')
    return [(r[ki].split('(')[0].replace('void ', '').replace('mlx::', ''), float(r[vi].replace(',', '')), r[gi])
            for r in rows[hdr_i + 1:] if len(r) > vi and r[vi]]


def one_step(k):
    """The last whole step: the output head (73448 rows of 4096) is the longest quantized product,
    once a step; its kernel and grid (those with the longest median launch: one launch may be slow
    for other reasons) mark the steps."""
    groups = collections.defaultdict(list)
    for name, ns, grid in k:
        if 'qm' in name:
            groups[(name, grid)].append(ns)
    head = max(groups, key=lambda g: sorted(groups[g])[len(groups[g]) // 2])
    marks = [i for i, (name, _, grid) in enumerate(k) if (name, grid) == head]
    return k[marks[-2] + 1:marks[-1] + 1]


if __name__ == '__main__':
    step = one_step(launches(sys.argv[1]))
    tot = sum(ns for _, ns, _ in step)
    print('kernels in one decode step', len(step), 'sum of durations us', round(tot / 1e3, 1))
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, ns, grid in step:
        key = name[:70] + ' ' + grid
        agg[key][0] += 1
        agg[key][1] += ns
    for key, (c, ns) in sorted(agg.items(), key=lambda x: -x[1][1])[:45]:
        print(f'{c:4d} {ns/1e3:8.1f} us {100*ns/tot:5.1f}%  avg {ns/c/1e3:6.1f}  {key}')
