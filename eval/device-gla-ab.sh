#!/bin/bash
# Issue 60: the GLA prompt kernels (cuda/gla_prefill.cu) against the float32 MLX form, one lease.
# The GPU test against the CPU's float32 form, every kernel's self-check, golden parity (its bf16
# chunk-boundary case has heads of 32, which take the kernels), `kernels prefill ROWS 32` (a SALA
# chunk's pieces, the GLA by both forms), then `sala bench` prefill of SALA-9B by the binary
# before (sala-base, the parent commit) and after, 8-bit and 4-bit at 4K and 32K, and Qwen3-8B
# (no GLA: its rows only show the machine is steady).
# Prepare here: SALA_OPENBLAS=off builds of sala (this commit and its parent, as sala-base), the
#   kernels bench, gpu_kernels and golden test binaries in .device/bin, stripped;
#   tar cJf .device/bin.tar.xz -C .device bin; cp -r ../shared/golden .device/
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"] (or only its
#   B_chunk_boundary, with GOLDEN_FILTER=b_chunk_boundary: a call carries 64 MiB);
#   bash eval/device-gla-ab.sh
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
if [ "${TESTS:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala \
    timeout 300 "$BIN/golden" --test-threads=1 ${GOLDEN_FILTER:-} > "$OUT/golden.log" 2>&1 &
  for t in gla_prefill_kernels_match_the_float32_chunked_form every_kernel_passes_its_self_check; do
    timeout 240 $BIN/gpu_kernels --include-ignored --exact $t --nocapture >> "$OUT/gpu-tests.log" 2>&1
    phase "gpu test $t rc=$?"
  done
  wait; phase "golden: $(grep 'test result' "$OUT/golden.log")"
  grep -E "^test " "$OUT/golden.log"
fi
for rows in ${PIECES:-2048}; do
  timeout 90 $BIN/kernels prefill "$rows" 32 > "$OUT/pieces-$rows.md" 2>&1; phase "pieces $rows rc=$?"; cat "$OUT/pieces-$rows.md"
done
bench() {  # NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  # One file for all runs: the device returns only a few files a call.
  echo "## $name: $bin bench $*" >> "$OUT/bench.md"
  timeout "${BENCH_SECONDS:-240}" $BIN/$bin bench -n 0 -d 0 -r 1 "$@" 2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
  phase "$name rc=${PIPESTATUS[0]}"
}
for bits in ${BITS:-8 4}; do
  bench "q$bits-base" sala-base --synthetic minicpm-sala-9b --bits "$bits" -p "${PROMPTS:-4096,32768}" --prefill-step 2048
  bench "q$bits-new" sala --synthetic minicpm-sala-9b --bits "$bits" -p "${PROMPTS:-4096,32768}" --prefill-step 2048
done
[ "${QWEN:-1}" = 1 ] && bench qwen-new sala --synthetic qwen3-8b --bits 8 -p 4096,32768 --prefill-step 2048
true
