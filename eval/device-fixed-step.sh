#!/bin/bash
# Issue 58: fixed decode steps (engine::fixed_step) on one lent GPU, in one call.
#  1. The kernels' self-checks, which now also run the forms reading a fixed step's counts from
#     the device, and tests/fixed_step.rs's MiniCPM-SALA test on the GPU (replayed steps against
#     steps built afresh; its SmolLM2 test needs a 94 MB file, over what a call carries).
#  2. `kernels fixed-step`: per decode step of the synthetic 9Bs at 4K, the host's building, its
#     encoding and the whole step, built afresh against fixed and replayed (8 and 4 bits).
#  3. `sala bench` at 4K, pipelined decode with SALA_FIXED_STEP off and on (the rate).
#  4. `kernels host-cost`: building and encoding per operation, single and chained, eager and
#     replayed by MLX's compile: whether a replay cuts MLX's encoding or only our building.
# Prepare (repo root, git-ignored paths), with SALA_OPENBLAS=off builds:
#   .device/bin: sala, gpu_kernels (target/release/deps/gpu_kernels-*), fixed_step
#   (target/release/deps/fixed_step-*), kernels (target/release/deps/kernels-*), stripped;
#   tar cJf .device/bin.tar.xz -C .device bin;
#   .device/golden: the golden cases A_dense_f32 and C_sparse_prefill (from ../shared/golden).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"];
#   PART=1 bash eval/device-fixed-step.sh (steps 1-2), then PART=2 (steps 3-4): each fits one
#   call's 10 minutes; results in $OUT/results.md and $OUT/tests.log.
set -u
source eval/device-setup.sh
mkdir -p .device/shared && ln -sfn "$PWD/.device/golden" .device/shared/golden
export SALA_SHARED=$PWD/.device/shared
if [ "${PART:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 timeout 240 $BIN/gpu_kernels --include-ignored --exact every_kernel_passes_its_self_check 2>&1 | tail -15 | tee -a "$OUT/tests.log"
  timeout 240 $BIN/fixed_step minicpm_sala --nocapture 2>&1 | grep -E "test |steps fixed|panicked|differ|result" | tee -a "$OUT/tests.log"
  for model in minicpm-sala-9b qwen3-8b; do
    for bits in 8 4; do
      echo "== $model $bits-bit" | tee -a "$OUT/results.md"
      SALA_KERNELS_MODEL=$model SALA_KERNELS_BITS=$bits timeout 150 $BIN/kernels fixed-step 4096 2>>"$OUT/errors.log" | tee -a "$OUT/results.md"
    done
  done
fi
if [ "${PART:-1}" = 2 ]; then
  # The rate users would see: sala bench's pipelined decode, steps built afresh then fixed.
  for model in minicpm-sala-9b qwen3-8b; do
    for fixed in off on; do
      echo "== $model 8-bit, SALA_FIXED_STEP=$fixed" | tee -a "$OUT/results.md"
      SALA_FIXED_STEP=$fixed timeout 150 $BIN/sala bench --synthetic $model --bits 8 -p 0 -n 128 -d 4096 -r 3 --profile -o md \
        2>>"$OUT/errors.log" | grep "tg128 " | tee -a "$OUT/results.md"
    done
  done
  echo "== host cost per operation" | tee -a "$OUT/results.md"
  timeout 100 $BIN/kernels host-cost 2>>"$OUT/errors.log" | tee -a "$OUT/results.md"
fi
rm -rf "$OUT/cache"
