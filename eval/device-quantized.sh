#!/bin/bash
# Quantized checkpoints on the lent GPU: the quantized-matmul and GGUF tests, then `sala run` on
# mlx-lm-written tiny models and `sala quantize` outputs, logits to $OUT (compare with a CPU run).
# Prepare here (repo root):
#   ../shared/tools/mlx-cuda-bundle                                  # -> .device/mlx-cuda (ignored)
#   cargo build --release && cargo test --release --no-run --test quantize --test gguf
#   mkdir -p .device/bin .device/q && strip -o .device/bin/sala target/release/sala
#   strip -o .device/bin/quantize target/release/deps/quantize-<hash>   (same for gguf)
#   copy model dirs (config.json + model.safetensors) into .device/q/<name>, the prompt ids into
#   .device/q/prompt.json
# Then on the device (carry [".device"]):  bash eval/device-quantized.sh
set -u
source .device/mlx-cuda/activate.sh
# The device's pip `nvidia` cu13 headers lack include/crt/ (NVRTC needs crt/mma.h to compile MLX's
# sm90 quantized matmul); overlay the system CUDA's crt/ onto a copy of that include tree.
NV=$(readlink -f /tmp/mlx-cuda/nvidia)
if [ ! -e /tmp/mlx-cuda/nvidia/cu13/include/crt ] && [ -d /usr/local/cuda/include/crt ]; then
  rm -f /tmp/mlx-cuda/nvidia && mkdir -p /tmp/mlx-cuda/nvidia/cu13/include
  for d in "$NV"/*; do [ "$(basename "$d")" = cu13 ] || ln -s "$d" /tmp/mlx-cuda/nvidia/; done
  for d in "$NV"/cu13/*; do [ "$(basename "$d")" = include ] || ln -s "$d" /tmp/mlx-cuda/nvidia/cu13/; done
  for f in "$NV"/cu13/include/*; do ln -s "$f" /tmp/mlx-cuda/nvidia/cu13/include/; done
  ln -s "$(readlink -f /usr/local/cuda/include/crt)" /tmp/mlx-cuda/nvidia/cu13/include/crt
fi
export MLX_ENABLE_TF32=0
./.device/bin/quantize quantized_matmul dequantize_quantize gguf_blocks 2>&1 | grep -E "^test |result|panicked|differ"
./.device/bin/gguf --skip block_types 2>&1 | grep -E "^test |result|panicked|differ"
IDS=$(python3 -c "import json; print(','.join(map(str, json.load(open('.device/q/prompt.json')))))")
for m in .device/q/*/; do
  c=$(basename "$m")
  for dtype in f32 bf16; do
    ./.device/bin/sala run --model "$m" --input-ids "$IDS" --temperature 0 --ignore-eos --max-tokens 4 \
      --dtype $dtype --device gpu --json --logits-out "$OUT/$c.$dtype.safetensors" 2>&1 | tail -2
  done
done
