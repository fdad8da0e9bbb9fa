#!/bin/bash
# Issue 60: a prefill change against its parent (built as sala-base and kernels-base), one call.
# First GPU tests (TESTS, a grep -E pattern of tests/gpu_kernels.rs names; every kernel's
# self-check by default) and golden parity on the GPU (eval/device-tests.sh); then `sala bench`
# prefill by both binaries: SALA-9B 8-bit at 4K and 32K, Qwen3-8B 8-bit at 4K (QWEN32K=1: and
# 32K); with PIECES=1 the kernels bench's pieces of a 2048-token chunk by both, at the contexts
# (in K) of PIECES_AT (default 32; 32,1024 adds the selection and attention at 1M).
# Prepare here: SALA_OPENBLAS=off builds of sala (and the kernels bench for PIECES) at this commit
# and its parent (sala-base, kernels-base), the gpu_kernels and golden test binaries, in
# .device/bin, stripped; tar cf - -C .device bin | xz -9 > .device/bin.tar.xz (the two sala
# binaries then cost one); cp -r ../shared/golden .device/. Carry [".device/bin.tar.xz",
# ".device/mlx-cuda", ".device/golden"] (64 MiB in all with the repository: no kernel cache).
# The epilogue kernels' call (eval/results/2026-12-03-h200-epilogue, call 5):
#   TESTS='epilogue_kernels|every_kernel_passes|qmv_epilogues|qmm_past_one_tile|qmv_with_norm_gate' TEST_SECONDS=300
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
TESTS=${TESTS:-'every_kernel_passes'} DEADLINE_S=${TEST_SECONDS:-300} bash eval/device-tests.sh
phase "tests rc=$?"
for model in minicpm-sala-9b qwen3-8b; do
  prompts=$([ $model = qwen3-8b ] && [ "${QWEN32K:-0}" = 0 ] && echo 4096 || echo 4096,32768)
  for b in sala-base sala; do
    echo "## $b: $model 8-bit" >> "$OUT/bench.md"
    timeout 200 $BIN/$b bench --synthetic $model --bits 8 -p $prompts -n 0 -d 0 -r 1 2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
    phase "bench $b $model rc=${PIPESTATUS[0]}"
  done
done
if [ "${PIECES:-0}" = 1 ]; then
  for k in kernels-base kernels; do
    timeout 150 $BIN/$k prefill 2048 ${PIECES_AT:-32} > "$OUT/pieces-$k.md" 2>&1; phase "pieces $k rc=$?"; cat "$OUT/pieces-$k.md"
  done
fi
