#!/bin/bash
# Issue 60: the dequantize kernel (kernels::dequantize) against MLX's dequantize, one lease.
# The GPU test (to the bit), `kernels dequantize` (the matrices alone and before a 2048-row
# product), `kernels prefill ROWS 32` (a SALA chunk's pieces at 32K), then `sala bench` prefill of
# both 8-bit synthetic shapes at 4K and 32K by the binary before (sala-base, the parent commit)
# and after, at --prefill-step 2048 and (after only) 4096, and of SALA at 4 bits by both.
# Prepare here: SALA_OPENBLAS=off builds of sala (this commit and its parent, as sala-base), the
#   kernels bench and gpu_kernels test binaries in .device/bin, stripped; tar cJf .device/bin.tar.xz -C .device bin.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-dequantize-ab.sh
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
timeout 120 $BIN/gpu_kernels --include-ignored --exact dequantize_kernel_gives_mlxs_values_to_the_bit --nocapture > "$OUT/gpu-dequantize.log" 2>&1
phase "gpu test rc=$?"; tail -3 "$OUT/gpu-dequantize.log"
timeout 90 $BIN/kernels dequantize > "$OUT/dequantize.md" 2>&1; phase "kernels dequantize rc=$?"; cat "$OUT/dequantize.md"
for rows in ${PIECES:-2048 4096}; do
  timeout 60 $BIN/kernels prefill "$rows" 32 > "$OUT/pieces-$rows.md" 2>&1; phase "pieces $rows rc=$?"; cat "$OUT/pieces-$rows.md"
done
bench() {  # NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  # One file for all runs: the device returns only a few files a call.
  echo "## $name: $bin bench $*" >> "$OUT/bench.md"
  timeout "${BENCH_SECONDS:-240}" $BIN/$bin bench -n 0 -d 0 -r 1 "$@" 2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
  phase "$name rc=${PIPESTATUS[0]}"
}
Q8="--synthetic minicpm-sala-9b --synthetic qwen3-8b --bits 8 -p 4096,32768"
bench pp-base-2048 sala-base $Q8 --prefill-step 2048
bench pp-new-2048 sala $Q8 --prefill-step 2048
bench pp-new-4096 sala $Q8 --prefill-step 4096
bench pp-base-4096 sala-base $Q8 --prefill-step 4096
bench pp4-base-2048 sala-base --synthetic minicpm-sala-9b --bits 4 -p 4096,32768 --prefill-step 2048
bench pp4-new-2048 sala --synthetic minicpm-sala-9b --bits 4 -p 4096,32768 --prefill-step 2048
