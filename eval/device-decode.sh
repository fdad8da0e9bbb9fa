#!/bin/bash
# Issue 6, decode features on the lent GPU in one call: self-speculative decoding, greedy decoding
# on the device and batched decode — correctness on the GPU (tests/gpu_kernels.rs,
# tests/speculative.rs and tests/batching.rs on a golden case, float32), then speed on the synthetic
# MiniCPM-SALA-9B (8-bit): pipelined decode at batch 1, 4 and 8, greedy generation plain and with a
# 16-layer draft. With $BIN/sala-old (a build of an earlier commit) the batch-1 decode runs with
# both binaries for a same-run before/after.
# Prepare on the CPU machine: SALA_OPENBLAS=off cargo build --release (and cargo test --no-run for
# the two test binaries); copy sala, speculative, batching to $BIN; copy ../shared/golden/C_sparse_prefill
# to .device/shared/golden/; ../shared/tools/mlx-cuda-bundle $MLX_BUNDLE --with-python. Carry them.
set -u
BIN=${BIN:-.device/bin}
# Binaries may come packed (the carry limit is 64 MiB).
[ -f $BIN/bin.tar.xz ] && tar xJf $BIN/bin.tar.xz -C $(dirname $BIN)
source ${MLX_BUNDLE:-.device/mlx-cuda-py}/activate.sh
OUT=${OUT:-/tmp}
DEPTH=${DEPTH:-4096}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
export SALA_SHARED=${SALA_SHARED:-.device/shared}
for t in gpu_kernels speculative batching; do
  [ -x $BIN/$t ] || continue
  MLX_ENABLE_TF32=0 $BIN/$t --include-ignored --test-threads=1 --skip smollm2 --skip dense_ 2>&1 | tee $OUT/$t.log | grep -E "^test |test result|panicked"
done
if [ -x $BIN/sala-old ]; then
  $BIN/sala-old bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 128 -d $DEPTH -r 3 -o md 2>&1 | tee $OUT/before.md | tail -3
fi
$BIN/sala bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 128 -d $DEPTH --n-seq 1,4,8 --draft-layers 0,16 --num-draft 3 -r 3 \
  -o csv --output-file $OUT/decode.csv 2>&1 | grep -v "^appended" | tee $OUT/decode.md
