#!/bin/bash
# Issue 59: the tensor-core product past one 16-row tile (cuda/qmv_mma.cu, up to 64 input rows),
# one H200, one call. The GPU test of the new forms and every kernel self-check; `sala bench` of
# Qwen3-8B's shape at 8 bits, decode steps by rows (--profile: host and device per step) and short
# prompt chunks, the binary before the change (sala-base) and after (sala) in turns; then the
# tilings of 32- and 64-row products under Nsight Compute (`kernels qmv-tiling 8 all ROWS`,
# eval/qmv_tiling.py) for as long as SWEEP_SECONDS allows.
# Prepare here (repo root): build sala, the kernels bench and the gpu_kernels test binary
#   (SALA_OPENBLAS=off, release), and the commit before as sala-base; copy them to .device/bin,
#   strip; tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-qmm-rows.sh
# The kernels compile into /tmp/device-serving/cache, where eval/device-serving.sh finds them in
# a later call on the warm machine. On a cold machine the GPU test alone compiles ~48 kernel forms
# (over 240 s): run it with TESTS=1 SWEEP=0 ROUNDS=0 in a call of its own, or after a call that
# compiled them. The results come back as one tarball ($OUT/qmm-rows.tar.xz): a call returns only
# a few files.
set -u
export DEVICE_CACHE=/tmp/device-serving/cache
source eval/device-setup.sh
RESULTS=$OUT
OUT=$(mktemp -d)
trap 'tar cJf "$RESULTS/qmm-rows.tar.xz" -C "$OUT" .' EXIT
if [ "${TESTS:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 timeout ${TEST_SECONDS:-240} $BIN/gpu_kernels --include-ignored --test-threads=1 ${TEST_FILTER:-qmm_past_one_tile every_kernel} 2>&1 \
    | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked|relative error"
  phase tests
fi
for round in $(seq "${ROUNDS:-1}"); do
  for bin in sala-base sala; do
    $BIN/$bin bench --synthetic qwen3-8b --bits 8 -p 0 -n 32 -d 512 --n-seq ${ROWS:-1,16,17,32,48,64} -r 2 --profile \
      > "$OUT/rows-$bin-$round.md" 2> "$OUT/rows-$bin-$round.err"
    phase "rows $bin $round"
    $BIN/$bin bench --synthetic qwen3-8b --bits 8 -p ${PROMPTS:-16,32,64,128,256} -n 0 -d 0 -r 3 \
      > "$OUT/pp-$bin-$round.md" 2> "$OUT/pp-$bin-$round.err"
    phase "pp $bin $round"
  done
done
if [ "${SWEEP:-1}" = 1 ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  for rows in ${SWEEP_ROWS:-64 32}; do
    timeout "${SWEEP_SECONDS:-120}" "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --profile-from-start off \
      --log-file "$OUT/ncu-tiling-$rows.csv" $BIN/kernels qmv-tiling 8 all "$rows" > "$OUT/tiling-$rows.txt" 2> "$OUT/tiling-$rows.err"
    python3 eval/qmv_tiling.py "$OUT/tiling-$rows.txt" "$OUT/ncu-tiling-$rows.csv" | tee "$OUT/qmv-tiling-q8-rows$rows.txt" | head -60
    xz -f "$OUT/ncu-tiling-$rows.csv"
    phase "sweep $rows"
  done
fi
