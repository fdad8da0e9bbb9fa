# The GEMV tilings of `kernels qmv-tiling` (benches/kernels.rs) from its output and an Nsight Compute
# CSV of the same run: ncu --profile-from-start off --metrics gpu__time_duration.sum --csv
# --log-file ncu.csv kernels qmv-tiling > out.txt; python3 eval/qmv_tiling.py out.txt ncu.csv.
# Every `TILING<TAB>label<TAB>n` line owns the next n profiled launches (one kernel each); per label
# the median duration, and per product the fastest tilings and MLX's quantized matmul.
import csv, collections, statistics, sys
labels = [l.rstrip('\n').split('\t')[1:] for l in open(sys.argv[1]) if l.startswith('TILING\t')]
rows = list(csv.reader(open(sys.argv[2])))
hdr_i = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
hdr = rows[hdr_i]
ki, vi = hdr.index('Kernel Name'), hdr.index('Metric Value')
mi = hdr.index('Metric Name') if 'Metric Name' in hdr else None
def metric(name):
    return [(r[ki], float(r[vi].replace(',', ''))) for r in rows[hdr_i + 1:]
            if len(r) > vi and r[vi] and (mi is None or r[mi] == name)]
launches = metric('gpu__time_duration.sum')
registers = [int(v) for _, v in metric('launch__registers_per_thread')] if mi is not None else []
by_product = collections.defaultdict(list)
at = 0
for label, n in labels:
    n = int(n)
    chunk = launches[at:at + n]
    at += n
    names = {name.split('(')[0] for name, _ in chunk}
    if len(names) != 1:
        sys.exit(f'{label}: expected one kernel per product, got {sorted(names)}')
    product, tiling = label.split(' | ')
    regs = f' [{registers[at - n]} regs]' if len(registers) == len(launches) else ''
    by_product[product].append((statistics.median(d for _, d in chunk) / 1e3, tiling, regs))
if at != len(launches):
    print(f'warning: {len(launches)} launches, labels account for {at}')
for product, results in by_product.items():
    default = next(t for t, name, _ in results if name == 'default')
    print(f'## {product}: default {default:.1f} us')
    best = sorted(results)[:6]
    for t, name, regs in best + [r for r in results if r[1] == 'mlx' and r not in best]:
        print(f'  {t:7.1f} us  {default / t:5.2f}x  {name}{regs}')
