# The draw's device durations from `kernels draw` (its table) and an Nsight Compute CSV of the same
# run with only the draw's launches profiled. A draw is one launch (the single-block kernel before
# 2026-11-29) or a chain: sala_draw_keys (since 2026-11-29), sala_draw_scan, then bins, floor and
# pick; each table row owns 23 draws (3 warm-up, 20 timed, benches/kernels.rs `time`), in order;
# draws before them (the self-check) are dropped. Prints each row's median device µs per draw (its
# launches summed) and each launch's median (the run's own host times, under the profiler, are left
# out: the run without it, `kernels draw`, gives them).
import csv, statistics, sys
STAGES = ('keys', 'scan', 'bins', 'floor', 'pick')
table = [l for l in open(sys.argv[1]) if l.startswith('| draw ')]
rows = list(csv.reader(open(sys.argv[2])))
hdr_i = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
ki, vi = rows[hdr_i].index('Kernel Name'), rows[hdr_i].index('Metric Value')
draws = []  # a dict per draw: stage -> µs
for r in rows[hdr_i + 1:]:
    if len(r) <= vi or not r[vi]:
        continue
    us = float(r[vi].replace(',', '')) / 1e3
    stage = next((s for s in STAGES if f'draw_{s}' in r[ki]), 'whole')
    # A draw ends with its pick (its keys and scan, independent, come in either order), or is one
    # single-block launch.
    if not draws or stage == 'whole' or any(s in draws[-1] for s in ('pick', 'whole')):
        draws.append({})
    draws[-1][stage] = draws[-1].get(stage, 0.0) + us
per = 23
extra = len(draws) - per * len(table)
if extra < 0:
    sys.exit(f'{len(draws)} draws for {len(table)} rows of {per}')
draws = draws[extra:]
print('| draw | device µs (median) | ' + ' | '.join(STAGES) + ' |')
print('|---|---:|' + '---:|' * len(STAGES))
for i, line in enumerate(table):
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    timed = draws[i * per + 3:(i + 1) * per]
    total = statistics.median(sum(d.values()) for d in timed)
    stage = [f'{statistics.median(d[s] for d in timed):.1f}' if all(s in d for d in timed) else '' for s in STAGES]
    print(f'| {cells[0][5:]} | {total:.1f} | ' + ' | '.join(stage) + ' |')
