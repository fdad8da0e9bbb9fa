#!/bin/bash
# Every GPU test on the lent GPU in one call: each ignored test of tests/gpu_kernels.rs as a process
# of its own, JOBS at a time (the tiling tests compile a kernel per tiling with NVRTC, on the CPU:
# one after another they outlast a call), and golden parity on the GPU (tests/golden.rs, f32) beside
# them. Correctness only: nothing here is timed, so the processes may share the GPU.
# Prepare here (repo root; the paths are git-ignored):
#   SALA_OPENBLAS=off cargo build --release
#   SALA_OPENBLAS=off cargo test --release --no-run --test gpu_kernels --test golden
#   copy sala and the two test binaries (cargo prints their paths) into .device/bin as sala,
#   gpu_kernels and golden; tar cJf .device/bin.tar.xz -C .device bin
#   ../shared/tools/mlx-cuda-bundle .device/mlx-cuda;  cp -r ../shared/golden .device/
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"] (~42 MiB);
#   bash eval/device-tests.sh
# Writes $OUT/gpu_kernels.log (every test's output, one after another), $OUT/golden.log and
# $OUT/device.txt; prints one line a test and exits non-zero if any failed or ran out of time.
set -u
source eval/device-setup.sh
JOBS=${JOBS:-8}
LIMIT_S=${LIMIT_S:-540}
LOGS=$(mktemp -d)
export BIN LOGS LIMIT_S MLX_ENABLE_TF32=0
# MLX's CUDA default for f32 matmuls is TF32; golden's tolerances are for full f32.
SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala XDG_CACHE_HOME=$LOGS/cache-golden \
  timeout "$LIMIT_S" "$BIN/golden" --test-threads=1 > "$OUT/golden.log" 2>&1 &
GOLDEN=$!
# Each test with a self-check memo of its own, so that each process checks every kernel itself.
run_one() {
  local start=$SECONDS
  XDG_CACHE_HOME=$LOGS/cache-$1 timeout "$LIMIT_S" "$BIN/gpu_kernels" --include-ignored --exact "$1" > "$LOGS/$1.log" 2>&1
  local rc=$?
  if [ $rc = 0 ] && grep -q "test result: ok. 1 passed" "$LOGS/$1.log"; then echo "PASS $1 ($((SECONDS - start)) s)"
  elif [ $rc = 124 ]; then echo "TIMEOUT $1 (${LIMIT_S} s)"
  else echo "FAIL $1 (exit $rc)"; fi
}
export -f run_one
# The tiling tests, the longest, first.
"$BIN/gpu_kernels" --include-ignored --list 2>/dev/null | sed -n 's/: test$//p' > "$LOGS/tests.txt"
{ grep tilings "$LOGS/tests.txt"; grep -v tilings "$LOGS/tests.txt"; } \
  | xargs -P "$JOBS" -I{} bash -c 'run_one {}' | tee "$LOGS/summary.txt"
for log in "$LOGS"/*.log; do echo "===== $(basename "$log" .log)"; cat "$log"; done > "$OUT/gpu_kernels.log"
wait "$GOLDEN"; echo "golden: exit $?"
grep -E "^test |test result" "$OUT/golden.log"
FAILED=$(grep -vc '^PASS' "$LOGS/summary.txt")
echo "gpu_kernels: $(grep -c '^PASS' "$LOGS/summary.txt") passed, $FAILED not"
[ "$FAILED" = 0 ] && grep -q "test result: ok" "$OUT/golden.log"
