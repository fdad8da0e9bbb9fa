# Each kernel of one SALA-9B decode step as a share of the GPU's memory bandwidth: the bytes it
# must move (weights, state, keys and values) over its Nsight Compute duration. Input: a CSV of
# `kernels decode-profile` as eval/ncu_step.py reads it (xz or plain), the weights' bits, the
# context in tokens and the GPU's peak in GB/s (H100 SXM HBM3: 3350).
#   python3 eval/kernel_shares.py ncu.csv.xz 4 4096 3350
# Kernels are told apart by name, grid and how many times a step launches them (24 lightning
# layers, 8 sparse, 32 MLPs, one head).
import collections, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_step import launches, one_step

path, bits, context, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
step = one_step(launches(path))

hidden, inter, vocab, heads, kv_heads, dim = 4096, 16384, 73448, 32, 2, 128
per_weight = bits / 8 + 4 / 64  # packed bits, and a bf16 scale and bias per group of 64
def matrix(n, kk):
    return n * kk * per_weight
state = 2 * heads * dim * dim * 4       # a lightning layer's float32 state, read and written
kv = 2 * kv_heads * dim * context * 2    # a sparse layer's bf16 keys and values at this context
# (name part, launches a step) -> (what it is, bytes a launch); the first match wins.
known = [
    ('qmv_swiglu', 32, 'gate/up (SwiGLU, norm folded in)', matrix(2 * inter, hidden)),
    ('qmv_residual_norm_gated', 24, 'lightning o_proj (norm and gate folded in)', matrix(hidden, hidden)),
    ('qmv_normed', 24, 'lightning qkvz (norm folded in)', matrix(4 * hidden, hidden)),
    ('qmv_normed', 8, 'sparse qkvg (norm folded in)', matrix(heads * dim + 2 * kv_heads * dim + hidden, hidden)),
    ('qmv_residual', 32, 'down (residual)', matrix(hidden, inter)),
    ('qmv_residual', 8, 'sparse o_proj (residual)', matrix(hidden, hidden)),
    ('qmv_', 1, 'output head', matrix(vocab, hidden)),
    ('lightning_step', 24, 'lightning decode step (state)', state),
    ('decode_attention', 8, 'sparse layer attention (keys, values)', kv),
]
launches = collections.defaultdict(list)
for name, ns, grid in step:
    launches[(name, grid)].append(ns)
table, other = [], 0.0
for (name, grid), times in launches.items():
    match = next((w for part, count, w, b in known if part in name and count == len(times)), None)
    if match is None:
        other += sum(times)
        continue
    nbytes = next(b for part, count, w, b in known if w == match)
    each = sum(times) / len(times)
    table.append((match, len(times), each / 1e3, nbytes, nbytes / each))
table.sort(key=lambda r: -r[1] * r[2])
total_ns = sum(ns for _, ns, _ in step)
print(f'{len(step)} kernels in one step, {total_ns / 1e3:.1f} µs of kernel time; peak {peak:.0f} GB/s\n')
print('| kernel | launches | µs each | MB each | GB/s | share of peak |')
print('|---|---:|---:|---:|---:|---:|')
moved = 0.0
for what, n, us, nbytes, gbs in table:
    moved += n * nbytes
    print(f'| {what} | {n} | {us:.1f} | {nbytes / 1e6:.1f} | {gbs:.0f} | {100 * gbs / peak:.0f} % |')
print(f'| everything else | | {other / 1e3:.1f} (all) | | | |')
print(f'\nBytes a step: {moved / 1e9:.2f} GB in {total_ns / 1e3:.0f} µs of kernels: {moved / total_ns:.0f} GB/s, '
      f'{100 * moved / total_ns / peak:.0f} % of peak; at peak the step would take {moved / peak / 1e3:.0f} µs.')
