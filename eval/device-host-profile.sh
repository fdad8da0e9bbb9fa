#!/bin/bash
# Issue 34: where the host's time goes in a decode step, on one GPU. A sampling profile of
# pipelined decoding (`kernels host-profile`), the graph of one step by kind of operation
# (`kernels decode-graph`), and the host/device split (`kernels decode-step`) and `sala bench`
# under MLX's CUDA graph settings (MLX_USE_CUDA_GRAPHS, MLX_MAX_OPS_PER_BUFFER), Qwen3-8B and the
# SALA-9B, 8-bit, at 4K.
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo build --release && SALA_OPENBLAS=off cargo bench --bench kernels --no-run
#   copy sala and the bench (as kernels) to .device/bin; strip sala, `strip --strip-debug` kernels
#   (the profile names functions from its symbols); tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-host-profile.sh
set -u
source eval/device-setup.sh
nproc; grep -m1 "model name" /proc/cpuinfo
for model in qwen3-8b minicpm-sala-9b; do
  SALA_KERNELS_MODEL=$model $BIN/kernels host-profile 4096 > "$OUT/host-profile-$model.md" 2>&1
  head -30 "$OUT/host-profile-$model.md"
  SALA_KERNELS_MODEL=$model $BIN/kernels decode-graph > "$OUT/decode-graph-$model.txt" 2>&1
  tail -40 "$OUT/decode-graph-$model.txt"
done
for setting in "" MLX_USE_CUDA_GRAPHS=0 MLX_MAX_OPS_PER_BUFFER=400 MLX_MAX_OPS_PER_BUFFER=2000; do
  for model in ${MODELS:-qwen3-8b}; do
    echo "== $model ${setting:-default}"
    env $setting SALA_KERNELS_MODEL=$model $BIN/kernels decode-step 4096 2>&1 | grep "^|" | tail -2
    env $setting $BIN/sala bench --synthetic $model --bits 8 -p 0 -n 64 -d 4096 -r 5 -o csv 2>/dev/null | tail -1
  done
done
