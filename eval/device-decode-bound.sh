#!/bin/bash
# Issue 58 (2026-11-29-h200-decode-bound): one call on one lent GPU after the 4-bit ring tiling
# and the bench's stamp fix.
#  1. The GPU tests of the normed products (the new 4-bit tilings of 8704 and 16384 rows).
#  2. sala bench of the synthetic SALA-9B at 4K, 4 and 8 bits: sala-base (the binary before the
#     change) against sala, alternating, pipelined and one served stream; then sala with
#     --profile (the pipelined row's first timed run no longer compiles the clock kernel).
# Prepare (repo root, git-ignored): .device/bin with sala, sala-base, gpu_kernels
#   (target/release/deps/gpu_kernels-*), kernels, SALA_OPENBLAS=off release builds, stripped;
#   tar cJf .device/bin.tar.xz -C .device bin.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-decode-bound.sh
# BITS ("4 8") picks the widths; BINS ("sala-base sala") the binaries, alternating; BENCH_FLAGS
# adds to every bench (e.g. --profile); TESTS=0 leaves the tests out (eval/device-tests.sh runs
# them in parallel, which a call's time allows).
set -u
source eval/device-setup.sh
if [ "${TESTS:-1}" != 0 ]; then
  MLX_ENABLE_TF32=0 timeout 120 $BIN/gpu_kernels --include-ignored qmv_with_ 2>&1 | grep -E "^test |test result|panicked|relative error" | tee "$OUT/tests.log"
fi
for bits in ${BITS:-4 8}; do
  for bin in ${BINS:-sala-base sala}; do
    echo "== $bin $bits-bit" | tee -a "$OUT/results.md"
    timeout 120 $BIN/$bin bench --synthetic minicpm-sala-9b --bits $bits -p 0 -n 128 -d 4096 -r 3 --n-seq 1 -o md ${BENCH_FLAGS:-} 2>>"$OUT/errors.log" \
      | grep "tg128" | tee -a "$OUT/results.md"
  done
done
if [ "${PROFILE:-1}" != 0 ]; then
  echo "== sala 8-bit --profile" | tee -a "$OUT/results.md"
  timeout 120 $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 128 -d 4096 -r 3 --profile -o md 2>>"$OUT/errors.log" \
    | grep -E "tg128|test " | tee -a "$OUT/results.md"
fi
rm -rf "$OUT/cache"
