#!/bin/bash
# The evaluator-thread tests (tests/encoder.rs) on the GPU, before a device-compare call: carry
# .device/golden (../shared/golden's C_sparse_prefill) with the compare kit.
set -u
tar xJf .device/bin.tar.xz -C .device
source ${MLX_BUNDLE:-.device/mlx-cuda-py}/activate.sh
SALA_SHARED=.device MLX_ENABLE_TF32=0 XDG_CACHE_HOME=/tmp/device-compare/cache .device/bin/encoder --test-threads=1 sala_ a_ 2>&1 | grep -E "^test |test result|panicked"
echo "encoder tests rc=${PIPESTATUS[0]}"
