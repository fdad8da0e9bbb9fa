#!/bin/bash
# The GPU kernels on the lent GPU (their tests, one after another longer than a call, are
# eval/device-tests.sh's): kernel timings next to MLX's (benches/kernels.rs; `kernels qmv`: the decode GEMV per 9B shape,
# `kernels prefill`: the pieces of a prefill chunk),
# then the synthetic 9B with kernels on and off.
# Binaries built on the CPU machine (SALA_OPENBLAS=off) and carried in $BIN; the MLX-CUDA runtime
# from ../shared/tools/mlx-cuda-bundle in $MLX_BUNDLE.
set -u
BIN=${BIN:-.device/bin}
source ${MLX_BUNDLE:-.device/mlx-cuda-py}/activate.sh
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$BIN/kernels 2>&1 | tee $OUT/kernels.md
# The decode GEMV alone on every matrix shape of a 9B decode step (achieved bandwidth per shape).
$BIN/kernels qmv 2>&1 | tee $OUT/kernels-qmv.md
# The pieces of one 2048-token prefill chunk at 32K / 128K / 512K tokens of context.
$BIN/kernels prefill 2>&1 | tee $OUT/kernels-prefill.md
[ "${KERNELS_ONLY:-0}" = 1 ] && exit 0
for kernels in on off; do
  echo "== kernels $kernels"
  SALA_KERNELS=$kernels $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 -p 2048 -n 64 -d 0,16384 -r 1 \
    -o md --output-file $OUT/bench-kernels-$kernels.md 2>&1 | tail -12
done
