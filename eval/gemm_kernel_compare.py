# Issue 60: MLX's bf16 matmul against PyTorch's cuBLAS on the prompt products, launch by launch,
# from the two Nsight Compute CSVs eval/device-gemm-kernels.sh writes: `kernels gemm` times each
# product in three layouts (23 launches each, benches/kernels.rs gemm_layouts) and the PyTorch
# loop runs each product 5 times, in the same order of shapes. Prints the x·Wᵀ layout's median
# beside PyTorch's, with the kernel each ran.
#   python3 eval/gemm_kernel_compare.py ncu-mlx.csv.xz ncu-torch.csv.xz
import sys

from ncu_step import launches

SHAPES = [(16384, 4096), (4096, 4096), (32768, 4096), (4096, 16384), (6144, 4096), (24576, 4096), (4096, 12288)]
mlx, torch = launches(sys.argv[1]), launches(sys.argv[2])
median = lambda xs: sorted(xs)[len(xs) // 2]
print('| M | N | K | MLX µs | PyTorch µs | MLX TFLOP/s | MLX kernel | PyTorch kernel |')
print('|---:|---:|---:|---:|---:|---:|---|---|')
for i, (m, (n, k)) in enumerate((m, s) for m in (2048, 4096) for s in SHAPES):
    ours, theirs = mlx[i * 69:i * 69 + 23], torch[i * 5:i * 5 + 5]
    us = median([ns for _, ns, _ in ours]) / 1e3
    print(f'| {m} | {n} | {k} | {us:.1f} | {median([ns for _, ns, _ in theirs]) / 1e3:.1f} | '
          f'{2 * m * n * k / us / 1e6:.0f} | {ours[0][0]} | {theirs[0][0]} |')
