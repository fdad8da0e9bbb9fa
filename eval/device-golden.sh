#!/bin/bash
# Runs the golden cases on the lent GPU with a binary built here against the CUDA libmlx.
# Prepare here (repo root):
#   ../shared/tools/mlx-cuda-bundle                      # -> .device/mlx-cuda (ignored)
#   tar xJf .device/mlx-cuda/runtime.tar.xz -C /tmp/mlxcuda  (or python's tarfile)
#   MLX_LINK_DIR=/tmp/mlxcuda/mlx/lib cargo build --release
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && cp -r ../shared/golden .device/
# Then on the device (carry [".device"]):  bash eval/device-golden.sh
# Logits land in $OUT/<case>.safetensors; compare them with the case's expected.safetensors.
set -u
source .device/mlx-cuda/activate.sh
export MLX_ENABLE_TF32=0   # full float32 matmuls (MLX's CUDA default is TF32)
for c in A_dense_f32 B_chunk_boundary C_sparse_prefill D_two_turn; do
  G=.device/golden/$c
  IDS=$(python3 -c "import json; print(','.join(map(str,json.load(open('$G/tokens.json'))['prompt_ids'])))")
  N=$(python3 -c "import json; print(len(json.load(open('$G/tokens.json'))['decode_input_ids'])+1)")
  echo "== $c"
  ./.device/bin/sala run --model "$G" --input-ids "$IDS" --temperature 0 --ignore-eos --max-tokens "$N" \
    --dtype f32 --device gpu --json --logits-out "$OUT/$c.safetensors"
done
