#!/bin/bash
# Issue 34: this binary against the one before (`sala-before`) on one GPU, the two alternating so
# that drift of the machine's host falls on both; after the decode attention kernel and dense
# parity tests on the GPU. Prepared as eval/device-fused-decode.sh (binaries in .device/bin.tar.xz).
# ONLY_4K=1: the kernel test, then Qwen3-8B at 4K only (needs only sala, sala-before, gpu_kernels).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-fused-ab.sh
set -u
source eval/device-setup.sh
MLX_ENABLE_TF32=0 $BIN/gpu_kernels --include-ignored --test-threads=1 decode_attention 2>&1 | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked"
ONLY_4K=${ONLY_4K:-0}
if [ "$ONLY_4K" != 1 ]; then
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu $BIN/dense_families --test-threads=1 2>&1 | tee "$OUT/dense_families.log" | grep -E "test result|panicked"
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala $BIN/golden --test-threads=1 c_decode d_two_turn 2>&1 | tee "$OUT/golden.log" | grep -E "^test |test result|panicked"
fi
DEPTHS=$([ "$ONLY_4K" = 1 ] && echo 4096 || echo 4096,32768)
for round in 1 2; do
  for sala in sala-before sala; do
    echo "== $sala round $round"
    $BIN/$sala bench --synthetic qwen3-8b --bits 8 -p 0 -n 64 -d $DEPTHS -r 2 -o csv --output-file "$OUT/$sala-qwen3-$round.csv" 2>&1 | grep -v "^appended" | tail -2
  done
done
[ "$ONLY_4K" = 1 ] && exit 0
for sala in sala-before sala; do
  echo "== $sala"
  $BIN/$sala bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 -r 3 -o csv --output-file "$OUT/$sala-9b.csv" 2>&1 | grep -v "^appended" | tail -1
done
timeout 80 $BIN/kernels decode-attention 2>&1 | grep -v "≤" | tee "$OUT/decode-attention.md"
