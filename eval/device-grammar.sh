#!/bin/bash
# What constrained decoding's token masks cost on the lent GPU: synthetic MiniCPM-SALA-9B 8-bit
# (MiniCPM4 tokenizer, vocab 73448), 128 tokens drawn on the host as `sala serve` draws them, one
# and eight sequences, free and under the grammar suite's JSON grammar, at depth 0 (the fastest
# steps, so the largest share) and 32K. Prepare here (repo root):
#   ../shared/tools/mlx-cuda-bundle                          # -> .device/mlx-cuda (ignored)
#   SALA_OPENBLAS=off cargo build --release
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && strip .device/bin/sala
#   mkdir -p .device/tokenizer && cp ../shared/assets/minicpm4-tokenizer/tokenizer*.json .device/tokenizer/
# On the device (carry [".device"]): bash eval/device-grammar.sh
set -u
source .device/mlx-cuda/activate.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
./.device/bin/sala bench --suite grammar --synthetic minicpm-sala-9b --bits 8 --tokenizer .device/tokenizer \
  -n 128 --n-seq 1,8 -d 0,32768 -r 3 -o csv --output-file "$OUT/grammar.csv" | tee "$OUT/grammar.md"
