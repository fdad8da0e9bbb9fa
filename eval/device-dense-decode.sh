#!/bin/bash
# Issue 34, the dense families' decode on one GPU: the kernels against their MLX-ops versions
# (tests/gpu_kernels.rs), the dense families against the float64 reference on the GPU
# (tests/dense_families.rs: decode goes through kernels::rope, kv and decode_attention), the decode
# attention by depth and split count (`kernels decode-attention`), then synthetic Qwen3-8B 8-bit
# decode at 4K/32K/128K with this binary and the one before (`sala-before`), in the same call.
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo build --release
#   SALA_OPENBLAS=off cargo test --release --no-run --test gpu_kernels --test dense_families --test golden
#   SALA_OPENBLAS=off cargo bench --bench kernels --no-run
#   copy sala, the two test binaries (as gpu_kernels, dense_families), the bench (as kernels) and the
#   earlier sala (as sala-before) to .device/bin; strip; tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-dense-decode.sh
set -u
source eval/device-setup.sh
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  MLX_ENABLE_TF32=0 $BIN/gpu_kernels --include-ignored --test-threads=1 2>&1 | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked"
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu $BIN/dense_families --test-threads=1 --nocapture 2>&1 | tee "$OUT/dense_families.log" | grep -E "^test |test result|panicked|Δlogit"
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device $BIN/golden --test-threads=1 2>&1 | tee "$OUT/golden.log" | grep -E "^test |test result|panicked"
  $BIN/kernels decode-attention 2>&1 | tee "$OUT/decode-attention.md"
fi
# 131008 + 64 generated tokens fit the preset's 131072 positions.
for sala in sala sala-before; do
  echo "== $sala"
  $BIN/$sala bench --synthetic qwen3-8b --bits 8 -p 0 -n 64 -d ${DEPTHS:-4096,32768,131008} -r 2 -o csv --output-file "$OUT/$sala.csv" 2>&1 | grep -v "^appended" | tail -5
  $BIN/$sala bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 -r 2 -o csv --output-file "$OUT/$sala-9b.csv" 2>&1 | grep -v "^appended" | tail -3
done
