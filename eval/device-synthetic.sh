#!/bin/bash
# Synthetic MiniCPM-SALA-9B vs Qwen3-8B (8-bit) on the lent GPU: prefill and decode at depth 0
# and 16K. Prepare here (repo root), as eval/device-golden.sh says, but with
# `SALA_OPENBLAS=off cargo build --release` (the device has no OpenBLAS), then
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && strip .device/bin/sala
# On the device (carry [".device/bin", ".device/mlx-cuda"]):  bash eval/device-synthetic.sh
set -u
source .device/mlx-cuda/activate.sh
nvidia-smi --query-gpu=name --format=csv,noheader
./.device/bin/sala bench --synthetic minicpm-sala-9b --synthetic qwen3-8b --bits 8 \
  -p 2048 -n 64 -d 0,16384 -r 2 -o md --output-file "$OUT/synth.md"
