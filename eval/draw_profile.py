# The draw's device durations from `kernels draw` (its table) and an Nsight Compute CSV of the same
# run with only the draw's launches profiled. A draw is one launch (the single-block kernel before
# 2026-11-29) or a chain starting with sala_draw_scan; each table row owns 23 draws (3 warm-up, 20
# timed, benches/kernels.rs `time`), in order; draws before them (the self-check) are dropped.
# Prints each row's median device µs per draw (its launches summed) beside the host-timed medians.
import csv, statistics, sys
table = [l for l in open(sys.argv[1]) if l.startswith('| draw ')]
rows = list(csv.reader(open(sys.argv[2])))
hdr_i = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
ki, vi = rows[hdr_i].index('Kernel Name'), rows[hdr_i].index('Metric Value')
draws = []
for r in rows[hdr_i + 1:]:
    if len(r) <= vi or not r[vi]:
        continue
    us = float(r[vi].replace(',', '')) / 1e3
    if 'draw_scan' in r[ki] or not any(k in r[ki] for k in ('draw_bins', 'draw_floor', 'draw_pick')):
        draws.append(0.0)
    draws[-1] += us
per = 23
extra = len(draws) - per * len(table)
if extra < 0:
    sys.exit(f'{len(draws)} draws for {len(table)} rows of {per}')
draws = draws[extra:]
print('| draw | device µs (median) | host-timed kernel µs | host-timed MLX µs |\n|---|---:|---:|---:|')
for i, line in enumerate(table):
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    print(f'| {cells[0][5:]} | {statistics.median(draws[i * per + 3:(i + 1) * per]):.1f} | {cells[1]} | {cells[2]} |')
