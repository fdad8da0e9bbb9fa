#!/bin/bash
# --kv-bits 8 on the lent GPU, a first look: golden A's greedy tokens with and without it (f32 with
# TF32 off, bf16; and on the host's CPU, where tests/kv_quant.rs runs), then the synthetic 9B's
# prefill and decode with and without it (speed and peak memory; the kernels read the rows
# dequantized for each step, not yet the codes in place).
# Prepare as eval/device-tests.sh says (sala in .device/bin.tar.xz; .device/mlx-cuda; .device/golden).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-kv-bits.sh
set -u
source eval/device-setup.sh
export MLX_ENABLE_TF32=0
A=.device/golden/A_dense_f32
run() { $BIN/sala run --model $A --input-ids 1,2,3,4,5,6,7,8 --max-tokens 16 --temperature 0 --ignore-eos --json "$@" 2>&1 | head -1; }
for dev in "gpu f32" "gpu bf16" "cpu f32"; do
  set -- $dev
  echo "golden A $1 $2 plain:   $(run --device $1 --dtype $2)"
  echo "golden A $1 $2 kv-bits: $(run --device $1 --dtype $2 --kv-bits 8)"
done
for kv in "" "--kv-bits 8"; do
  echo "== minicpm-sala-9b q8 ${kv:-plain KV}"
  $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 $kv -p 4096 -n 32 -d 0 -r 1 2>&1 | tail -4
done
