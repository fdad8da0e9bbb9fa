#!/bin/bash
# Issue 58: the general GEMV's unpacking of 4-bit weights in pairs (src/kernels/qmv.rs
# QmvTiling::half_pairs; a default for the SwiGLU and the 8192–16384-row products since
# 2026-11-29, the L2-prefetch option it was measured beside removed as slower everywhere), on one
# lent GPU in one call.
#  1. Correctness: qmv_half_pairs_keep_the_bits (the same bits with and without) and the normed
#     products' tests, through eval/device-tests.sh.
#  2. Speed: each product's default tiling alone and with half pairs switched the other way under
#     Nsight Compute (`kernels qmv-tiling BITS all 1 options`, eval/qmv_tiling.py), at 4 bits.
# Prepare (repo root, git-ignored): .device/bin with sala, gpu_kernels (target/release/deps/
#   gpu_kernels-*) and kernels (target/release/deps/kernels-*), SALA_OPENBLAS=off release builds,
#   stripped; tar cJf .device/bin.tar.xz -C .device bin.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-qmv-options.sh
set -u
GOLDEN=0 DEADLINE_S=${DEADLINE_S:-300} TESTS='qmv_half_pairs|qmv_with_' bash eval/device-tests.sh
source eval/device-setup.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
bits=4
timeout 120 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --profile-from-start off \
  --log-file "$OUT/ncu-options-q$bits.csv" $BIN/kernels qmv-tiling $bits all 1 options > "$OUT/options-q$bits.txt" 2> "$OUT/options-q$bits.err"
python3 eval/qmv_tiling.py "$OUT/options-q$bits.txt" "$OUT/ncu-options-q$bits.csv" | tee "$OUT/qmv-options-q$bits.txt"
xz -f "$OUT/ncu-options-q$bits.csv"
rm -rf "$OUT/cache"
