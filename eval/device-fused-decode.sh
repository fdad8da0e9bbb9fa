#!/bin/bash
# Issue 34, fewer launches per decode step: the decode attention merges its own splits, and the
# dense families' RoPE writes the keys and values into the recent-token buffers (one launch for
# both). On one GPU: the kernels against their MLX-ops versions (tests/gpu_kernels.rs), the dense
# families against the float64 reference on the GPU, golden parity, then decode speed of this
# binary and the one before (`sala-before`) in the same call: Qwen3-8B and the SALA-9B, 8-bit.
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo build --release
#   SALA_OPENBLAS=off cargo test --release --no-run --test gpu_kernels --test dense_families --test golden
#   copy sala, the three test binaries (by their names) and the earlier sala (as sala-before) to
#   .device/bin; strip; tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-fused-decode.sh
set -u
source eval/device-setup.sh
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  MLX_ENABLE_TF32=0 $BIN/gpu_kernels --include-ignored --test-threads=1 decode_attention rope_append every_kernel 2>&1 | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked"
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu $BIN/dense_families --test-threads=1 --nocapture 2>&1 | tee "$OUT/dense_families.log" | grep -E "^test |test result|panicked|Δlogit"
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala $BIN/golden --test-threads=1 2>&1 | tee "$OUT/golden.log" | grep -E "^test |test result|panicked"
fi
for sala in sala-before sala; do
  echo "== $sala"
  $BIN/$sala bench --synthetic qwen3-8b --bits 8 -p 0 -n 64 -d ${DEPTHS:-4096,32768} -r 3 -o csv --output-file "$OUT/$sala-qwen3.csv" 2>&1 | grep -v "^appended" | tail -3
  $BIN/$sala bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 -r 3 -o csv --output-file "$OUT/$sala-9b.csv" 2>&1 | grep -v "^appended" | tail -2
done
# The decode attention alone by depth (medians of 20 evaluated calls, MLX's attention beside it).
[ "${KERNELS:-1}" = 1 ] && timeout 90 $BIN/kernels decode-attention 2>&1 | grep -v "≤" | tee "$OUT/decode-attention.md"
