#!/bin/bash
# Issue 60: which cuBLASLt kernel MLX's bf16 matmul runs for a prompt product, and for how long,
# beside the kernel PyTorch's cuBLAS picks for the same product on the same GPU (ncu, each launch
# timed on the device: no host floor). CHECKS=1 first runs the attention/GLA GPU tests and every
# kernel's self-check, and golden C (sparse prefill) on the GPU.
# Prepare here as for eval/device-attention-ab.sh; carry [".device/bin.tar.xz", ".device/mlx-cuda",
# ".device/golden", ".device/kernel-cache.tar.xz"].
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
if [ "${CHECKS:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala \
    timeout ${TEST_SECONDS:-300} "$BIN/golden" --test-threads=1 c_sparse > "$OUT/golden.log" 2>&1 &
  for t in block_sparse_attention_kernel_matches_mlx block_sparse_attention_reads_an_8_bit_cache_in_place \
    gla_prefill_kernels_match_the_float32_chunked_form every_kernel_passes_its_self_check; do
    # MLX's CUDA float32 matmuls default to TF32; the oracles' tolerances are for full float32.
    (MLX_ENABLE_TF32=0 timeout ${TEST_SECONDS:-280} $BIN/gpu_kernels --include-ignored --exact $t --nocapture > "$OUT/gpu-test-$t.log" 2>&1
     phase "gpu test $t rc=$?") &
  done
  wait; cat "$OUT"/gpu-test-*.log > "$OUT/gpu-tests.log"; rm "$OUT"/gpu-test-*.log
  phase "golden: $(grep 'test result' "$OUT/golden.log")"; grep -E "^test " "$OUT/golden.log" "$OUT/gpu-tests.log"
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 150 "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum -k "regex:gemm|xmma|cutlass|sm90" --log-file "$OUT/ncu-mlx.csv" \
  $BIN/kernels gemm > "$OUT/gemm-mlx.md" 2>&1; phase "ncu mlx rc=$?"
python3 eval/ncu_step.py --all "$OUT/ncu-mlx.csv" > "$OUT/ncu-mlx.md"; cat "$OUT/ncu-mlx.md" | head -40
timeout 150 "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum -k "regex:gemm|xmma|cutlass|sm90" --log-file "$OUT/ncu-torch.csv" python3 -c "
import torch
for m in (2048, 4096):
    for n, k in [(16384, 4096), (4096, 4096), (32768, 4096), (4096, 16384), (6144, 4096), (24576, 4096), (4096, 12288)]:
        x = torch.randn(m, k, device='cuda', dtype=torch.bfloat16); w = torch.randn(n, k, device='cuda', dtype=torch.bfloat16)
        for _ in range(5): y = x @ w.t()
        torch.cuda.synchronize()
" > "$OUT/torch.log" 2>&1; phase "ncu torch rc=$?"
python3 eval/ncu_step.py --all "$OUT/ncu-torch.csv" > "$OUT/ncu-torch.md"; cat "$OUT/ncu-torch.md" | head -40
xz -f "$OUT"/ncu-*.csv
