#!/usr/bin/env python3
"""Issue 60: what the GPU's own GEMM libraries reach on the prompt products, outside MLX.

PyTorch's bf16 matmul (cuBLAS/cuBLASLt with its own algorithm choice) and its FP8 e4m3 product
(`torch._scaled_mm`, a scale per row of x and per output channel of W) on the products one layer
of Qwen3-8B and MiniCPM-SALA-9B runs for a prompt chunk of M rows (q/k/v and gate/up stacked as
the models stack them). The ceiling MLX's bf16 matmul is held against, and what an FP8 path could
gain. Prints one markdown table; run on the device with the image's python3 (it has PyTorch).
"""
import sys

import torch

SHAPES = {  # name: (K, N) of x [M, K] · Wᵀ with W [N, K]
    "qkv (Qwen3-8B)": (4096, 6144),
    "o": (4096, 4096),
    "gate+up (Qwen3-8B)": (4096, 24576),
    "down (Qwen3-8B)": (12288, 4096),
    "gate+up (SALA-9B)": (4096, 32768),
    "down (SALA-9B)": (16384, 4096),
}
ROWS = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "2048,4096,8192").split(",")]
REPS = 30


def timed_us(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / REPS


def fp8_product(x, w):
    """x · Wᵀ in e4m3 with a scale per row of x and per row of W, the scaling included."""
    fp8 = torch.float8_e4m3fn
    top = torch.finfo(fp8).max
    sx = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / top
    sw = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / top
    x8 = (x.float() / sx).to(fp8)
    w8 = (w.float() / sw).to(fp8)
    return x8, sx, w8, sw


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuBLAS {torch.backends.cuda.preferred_blas_library()}")
    print()
    print("| product | M | bf16 µs | bf16 TFLOP/s | fp8 µs (product) | fp8 TFLOP/s | fp8 µs (+ rounding x) | fp8 rel. error | bf16 / fp8 (+ rounding) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in ROWS:
        for name, (k, n) in SHAPES.items():
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            flop = 2 * m * k * n
            bf16 = timed_us(lambda: x @ w.t())
            row = f"| {name} | {m} | {bf16:.1f} | {flop / bf16 / 1e6:.0f} |"
            try:
                x8, sx, w8, sw = fp8_product(x, w)
                product = lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(), out_dtype=torch.bfloat16, use_fast_accum=True)
                fp8 = timed_us(product)

                def rounded_then_product():
                    xs = x.abs().amax(dim=1, keepdim=True).float() / torch.finfo(torch.float8_e4m3fn).max
                    return torch._scaled_mm((x.float() / xs).to(torch.float8_e4m3fn), w8.t(), scale_a=xs, scale_b=sw.t(), out_dtype=torch.bfloat16, use_fast_accum=True)

                fp8_all = timed_us(rounded_then_product)
                exact = x.float() @ w.float().t()
                err = ((product().float() - exact).norm() / exact.norm()).item()
                row += f" {fp8:.1f} | {flop / fp8 / 1e6:.0f} | {fp8_all:.1f} | {err:.2e} | {bf16 / fp8_all:.2f}× |"
            except Exception as e:  # an older PyTorch without row-wise scales
                row += f" {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | | |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
