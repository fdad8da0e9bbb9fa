#!/bin/bash
# Issue 60: the int8 prompt product (cuda/qmm_i8.cu), one H200, one call. Its GPU test against
# the MLX-ops oracle (which also prints how far x's rounding to 8 bits moves the product), then
# `kernels qmm-i8`: the product against MLX's 8-bit quantized matmul and against the models' path
# for prompt chunks (dequantize, then MLX's bf16 matmul) on 2048-row chunks of Qwen3-8B's and
# SALA-9B's matrices, and optionally (NCU=1) the int8 kernel under Nsight Compute.
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo test --release --no-run --test gpu_kernels; SALA_OPENBLAS=off cargo bench --bench kernels --no-run
#   copy the two binaries to .device/bin as gpu_kernels and kernels, strip; tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-qmm-i8.sh
# Back in $OUT: qmm-i8.tar.xz (the test's log, the table, phases.txt).
set -u
export DEVICE_CACHE=/tmp/device-serving/cache
source eval/device-setup.sh
RESULTS=$OUT
OUT=$(mktemp -d)
trap 'tar cJf "$RESULTS/qmm-i8.tar.xz" -C "$OUT" .' EXIT
timeout ${TEST_SECONDS:-180} $BIN/gpu_kernels --include-ignored --exact int8_prompt_product_matches_its_oracle --nocapture 2>&1 \
  | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked|against|error"
phase test
timeout ${BENCH_SECONDS:-180} $BIN/kernels qmm-i8 2>&1 | tee "$OUT/qmm-i8.md"
phase bench
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  timeout "${NCU_SECONDS:-150}" "$NCU_BIN" --kernel-name regex:sala_qmm_i8 --launch-count 2 --set full --csv \
    --log-file "$OUT/ncu-qmm-i8.csv" $BIN/kernels qmm-i8 > /dev/null 2>&1
  xz -f "$OUT/ncu-qmm-i8.csv"
  phase ncu
fi
