#!/bin/bash
# Issue 57: the fused draw kernel (cuda/draw.cu) and reads that leave the evaluator thread free,
# against the MLX-ops draw and blocking reads, on one lent GPU, with `sala bench --profile`
# splitting each decode step's host time. Binaries of one tree, each a variant (BINS):
#   sala-base    the MLX-ops draw (load.rs's use_draw_kernel line commented out), the evaluator
#                thread waiting for each read (engine/encoder.rs as of 6905448, with the profile's timers)
#   sala-kernel  the draw kernel, the evaluator still waiting for each read
#   sala         both changes (the tree as committed)
# Any other name in BINS is taken as another build to set beside them (say sala-7bf0f66 for that
# commit's tree). First the GPU tests of the draw (TESTS; none with TESTS=).
# Prepare (repo root, git-ignored paths): the binaries and the gpu_kernels test binary (as
# gpu_kernels) in .device/bin, stripped; tar cJf .device/bin.tar.xz -C .device bin; the MLX CUDA
# bundle in .device/mlx-cuda and the MiniCPM4 tokenizer in .device/tokenizer (eval/device-served.sh).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/tokenizer"]; bash eval/device-draw.sh
#   STEPS="speed grammar", MODELS, BINS, N (tokens, 128), R (repetitions, 2) pick what runs; everything lands in $OUT/results.md.
set -u
source eval/device-setup.sh
N=${N:-128}
# The tests first: a call cut by its time limit still has them.
echo "== GPU tests"
for t in ${TESTS-device_draws_on_the_gpu_equal_the_cpus every_kernel_passes_its_self_check}; do
  MLX_ENABLE_TF32=0 timeout 200 $BIN/gpu_kernels --include-ignored --exact $t 2>&1 | tail -15 | tee -a "$OUT/tests.log"
done
for step in ${STEPS:-speed grammar}; do
  for model in ${MODELS:-minicpm-sala-9b qwen3-8b}; do
    for bin in ${BINS:-sala-base sala-kernel sala}; do
      echo "== $bin $model $step" | tee -a "$OUT/results.md"
      case $step in
        speed) args="--n-seq 1,16" ;;
        grammar) args="--n-seq 1,16 --suite grammar --tokenizer .device/tokenizer" ;;
      esac
      timeout 150 $BIN/$bin bench --synthetic $model --bits 8 -p 0 -n $N -r ${R:-2} $args --profile -o md 2>>"$OUT/errors.log" \
        | grep "tg" | tee -a "$OUT/results.md"
    done
  done
done
