#!/bin/bash
# Issue 60: the prompt products' SwiGLU and residual steps as one kernel each (cuda/epilogue.cu)
# against MLX's separate operations (the parent commit, built as sala-base), one call.
# First the GPU tests of the epilogue kernels, of the decode products whose epilogues moved to
# cuda/round.cu, every kernel's self-check and golden parity on the GPU (eval/device-tests.sh);
# then `sala bench` prefill by both binaries: SALA-9B 8-bit at 4K and 32K, Qwen3-8B 8-bit at 4K.
# Prepare here: SALA_OPENBLAS=off builds of sala at this commit and its parent (sala-base), the
# gpu_kernels and golden test binaries, in .device/bin, stripped; tar cJf .device/bin.tar.xz -C
# .device bin; cp -r ../shared/golden .device/. Carry [".device/bin.tar.xz", ".device/mlx-cuda",
# ".device/golden", ".device/kernel-cache.tar.xz"] (the last, if an earlier call sent one back).
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
phase() { echo "$(date +%s) +${SECONDS}s $*" | tee -a "$OUT/phases.txt"; }
TESTS=${TESTS:-'epilogue_kernels|every_kernel_passes|qmv_epilogues|qmm_past_one_tile|qmv_with_norm_gate'} \
  DEADLINE_S=${TEST_SECONDS:-300} bash eval/device-tests.sh
phase "tests rc=$?"
for model in minicpm-sala-9b qwen3-8b; do
  prompts=$([ $model = qwen3-8b ] && echo 4096 || echo 4096,32768)
  for b in sala-base sala; do
    echo "## $b: $model 8-bit" >> "$OUT/bench.md"
    timeout 200 $BIN/$b bench --synthetic $model --bits 8 -p $prompts -n 0 -d 0 -r 1 2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
    phase "bench $b $model rc=${PIPESTATUS[0]}"
  done
done
