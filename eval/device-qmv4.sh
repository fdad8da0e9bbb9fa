#!/bin/bash
# Issue 34: the 4-bit decode GEMV on tensor cores (cuda/qmv_rows_mma.cu), one GPU, one call.
# The GPU kernel tests of the general kernel and every self-check; then `sala bench` of the
# synthetic SALA-9B q4 at 4K, the binary before the change (sala-base) against after, alternating;
# then one decode step's kernels under Nsight Compute (eval/ncu_step.py), the tilings sweep of
# the 4-bit one-row products (`kernels qmv-tiling 4 all 1`, eval/qmv_tiling.py).
# Prepare here (repo root): build sala, the kernels bench and the gpu_kernels test binary
#   (SALA_OPENBLAS=off, release); copy them and the previous commit's sala (as sala-base) to
#   .device/bin, strip; tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-qmv4.sh
set -u
source eval/device-setup.sh
if [ "${TESTS:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 $BIN/gpu_kernels --include-ignored --test-threads=1 ${TEST_FILTER:-qmv every_kernel} 2>&1 | tee "$OUT/gpu_kernels.log" \
    | grep -E "^test |test result|panicked|relative error"
fi
for round in $(seq "${ROUNDS:-2}"); do
  for bin in sala-base sala; do
    echo "== $bin round $round"
    $BIN/$bin bench --synthetic minicpm-sala-9b --bits 4 -p 0 -n 64 -d 4096 -r 3 -o csv 2>/dev/null | tail -1 | cut -d, -f1,18,19
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
export SALA_KERNELS_MODEL=minicpm-sala-9b SALA_KERNELS_BITS=4
if [ "${STEP:-1}" = 1 ]; then
  timeout 240 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv \
    --profile-from-start off --log-file "$OUT/ncu-q4.csv" $BIN/kernels decode-profile 4096 > /dev/null 2>&1
  python3 eval/ncu_step.py "$OUT/ncu-q4.csv" | tee "$OUT/ncu-q4.txt" | head -24
  xz -f "$OUT/ncu-q4.csv"
fi
# Where the SwiGLU product's warps wait: one launch under Nsight Compute's stall sections.
if [ "${DETAIL:-0}" = 1 ]; then
  timeout 120 "$NCU" --clock-control none --profile-from-start off -k regex:qmv_swiglu_normed_bfloat16_t_4_ --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
    $BIN/kernels decode-profile 512 > "$OUT/ncu-swiglu-detail.txt" 2>&1
  grep -vE "^==PROF==|decode step done" "$OUT/ncu-swiglu-detail.txt" | head -90
fi
if [ "${SWEEP:-1}" = 1 ]; then
  timeout "${SWEEP_SECONDS:-200}" "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --profile-from-start off \
    --log-file "$OUT/ncu-tiling.csv" $BIN/kernels qmv-tiling ${SWEEP_ARGS:-4 all 1 tc} > "$OUT/tiling.txt" 2> "$OUT/tiling.err"
  python3 eval/qmv_tiling.py "$OUT/tiling.txt" "$OUT/ncu-tiling.csv" | tee "$OUT/qmv-tiling-q4.txt" | head -80
  xz -f "$OUT/ncu-tiling.csv"
fi
