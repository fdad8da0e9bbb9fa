# The kernels of one decode step from an Nsight Compute CSV of `kernels decode-profile`
# (benches/kernels.rs): ncu --metrics gpu__time_duration.sum --clock-control none --csv
# --log-file ncu.csv kernels decode-profile; python3 eval/ncu_step.py ncu.csv[.xz]. The step runs
# from after one output-head product to the next; durations summed per kernel. eval/kernel_shares.py
# reads the step through one_step(). `python3 eval/ncu_step.py --all ncu.csv [KERNEL]` sums every
# launch of any profile by kernel name instead (from the first KERNEL launch on, if given).
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


def by_kernel(path, top=40, start=None):
    """Every launch of a profile summed by kernel name: its total, then the largest names. With
    `start` (a part of a kernel name), from 20 launches before the first launch of that kernel
    (a model's build before its first product left out)."""
    k = launches(path)
    if start:
        k = k[max(0, next(i for i, (name, _, _) in enumerate(k) if start in name) - 20):]
    agg = collections.defaultdict(list)
    for name, ns, _ in k:
        agg[name[:100]].append(ns)
    total = sum(sum(v) for v in agg.values())
    print(f'all kernels: {total / 1e6:.2f} ms, {sum(len(v) for v in agg.values())} launches')
    for name, ns in sorted(agg.items(), key=lambda x: -sum(x[1]))[:top]:
        ns.sort()
        print(f'{len(ns):6d} {sum(ns) / 1e6:8.2f} ms {100 * sum(ns) / total:5.1f}%  median {ns[len(ns) // 2] / 1e3:8.1f} us  {name}')


if __name__ == '__main__' and sys.argv[1] == '--all':  # a whole run's kernels, not one decode step
    by_kernel(sys.argv[2], start=sys.argv[3] if len(sys.argv) > 3 else None)
elif __name__ == '__main__':
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
