#!/bin/bash
# A refactor that must change nothing, checked on one lent GPU in one call: the GPU kernels
# against their MLX-ops versions; the golden cases' logits of the new binary against the old
# one's (byte for byte); and speed, old and new binaries interleaved (old, new, old, new) so that
# drift of the machine hits both. Prepare here (repo root), for OLD and NEW commits:
#   SALA_OPENBLAS=off cargo build --release && cp target/release/sala .device/bin/sala-$V && strip .device/bin/sala-$V
#   (NEW also) SALA_OPENBLAS=off cargo test --release --no-run --test gpu_kernels; copy the binary to .device/bin/gpu_kernels
#   tar cJf .device/bin.tar.xz -C .device bin; cp -r ../shared/golden .device/
#   ../shared/tools/mlx-cuda-bundle                       # -> .device/mlx-cuda
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-refactor.sh
set -u
tar xJf .device/bin.tar.xz -C .device
BIN=.device/bin
source .device/mlx-cuda/activate.sh
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
# The kernel tests take minutes (13 of them, about 8 on an H100): PARTS=kernels, PARTS=golden,bench or all.
PARTS=${PARTS:-kernels,golden,bench}
if [[ $PARTS == *kernels* ]]; then
  MLX_ENABLE_TF32=0 $BIN/gpu_kernels --include-ignored --test-threads=1 ${KERNEL_TESTS:-} 2>&1 | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked"
fi
[[ $PARTS == *golden* ]] && for c in A_dense_f32 B_chunk_boundary C_sparse_prefill D_two_turn; do
  G=.device/golden/$c
  IDS=$(python3 -c "import json; print(','.join(map(str,json.load(open('$G/tokens.json'))['prompt_ids'])))")
  N=$(python3 -c "import json; print(len(json.load(open('$G/tokens.json'))['decode_input_ids'])+1)")
  for v in old new; do
    MLX_ENABLE_TF32=0 $BIN/sala-$v run --model "$G" --input-ids "$IDS" --temperature 0 --ignore-eos --max-tokens "$N" \
      --dtype f32 --device gpu --logits-out "/tmp/$c-$v.safetensors" > "/tmp/$c-$v.log" 2>&1
  done
  cmp -s "/tmp/$c-old.safetensors" "/tmp/$c-new.safetensors" && echo "golden $c: logits identical" || { echo "golden $c: logits DIFFER"; tail -2 "/tmp/$c-old.log" "/tmp/$c-new.log"; }
done | tee "$OUT/golden.txt"
[[ $PARTS == *bench* ]] || exit 0
for round in 1 2; do
  for v in old new; do
    for preset in minicpm-sala-9b qwen3-8b; do
      $BIN/sala-$v bench --synthetic $preset --bits 8 -p 4096 -n 64 -d 0,16384 -r 2 -o csv --output-file "$OUT/bench-$v.csv" 2>&1 \
        | grep -v "^appended" | tail -6
    done
  done
done
