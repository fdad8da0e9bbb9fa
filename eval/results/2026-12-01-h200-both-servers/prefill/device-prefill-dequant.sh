#!/bin/bash
# Call 1's prefill bench, as run (from the repository root, with prefill/dequantized-path.patch applied
# to b4d6c6d, sala and the gpu_kernels test binary built with SALA_OPENBLAS=off --release, stripped
# and packed as .device/bin.tar.xz): the GPU test of the dequantized path, then `sala bench` prefill
# of Qwen3-8B's and MiniCPM-SALA-9B's shapes at 8 bits, at 4K and 32K, without and with it.
set -u
export DEVICE_CACHE=/tmp/device-serving/cache
source eval/device-setup.sh
RESULTS=$OUT
OUT=$(mktemp -d)
trap 'tar cJf "$RESULTS/prefill-dequant.tar.xz" -C "$OUT" .' EXIT
phase() { echo "$(date +%s) +${SECONDS}s $*" | tee -a "$OUT/phases.txt"; }
timeout 120 $BIN/gpu_kernels --include-ignored --exact dequantized_product_of_a_prompt_chunk_matches_mlx_quantized_matmul --nocapture \
  > "$OUT/gpu_kernels.log" 2>&1
phase "gputest rc=$? $(grep -E '^test result' "$OUT/gpu_kernels.log")"
for round in $(seq "${ROUNDS:-1}"); do
  for rows in "" ${ROWS:-512}; do
    for bits in ${BITS:-8}; do
      SALA_DEQUANTIZED_ROWS=$rows timeout 200 $BIN/sala bench --synthetic qwen3-8b --synthetic minicpm-sala-9b --bits "$bits" \
        -p ${PROMPTS:-4096,32768} -n 0 -d 0 -r ${REPS:-2} > "$OUT/pp-q$bits-rows${rows:-off}-$round.md" 2> "$OUT/pp-q$bits-rows${rows:-off}-$round.err"
      phase "pp q$bits dequantized from ${rows:-never} round $round rc=$?"
    done
  done
done
