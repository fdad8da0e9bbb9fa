# The kernels of the sparse layer's decode steps from an Nsight Compute CSV of `kernels
# sparse-profile N …` (benches/kernels.rs: one profiled step per setting and length, in order):
# python3 eval/ncu_sparse.py ncu.csv[.xz]. Prints each step's launches in order, and their sum; a
# step starts at each launch of the first kernel profiled.
import sys

from ncu_step import launches

k = launches(sys.argv[1])
starts = [i for i, (name, _, _) in enumerate(k) if name == k[0][0]] + [len(k)]
for n, (a, b) in enumerate(zip(starts, starts[1:])):
    print(f'step {n}:')
    for name, ns, grid in k[a:b]:
        print(f'  {ns / 1e3:8.1f} µs  {name[:60]} {grid}')
    print(f'  {sum(ns for _, ns, _ in k[a:b]) / 1e3:8.1f} µs  in all, {b - a} kernels')
