#!/bin/bash
# Every GPU test on the lent GPU: each ignored test of tests/gpu_kernels.rs as a process
# of its own, JOBS (10) at a time (the tiling tests compile a kernel per tiling with NVRTC, on the CPU:
# one after another they outlast a call), and golden parity on the GPU (tests/golden.rs, f32) beside
# them. Correctness only: nothing here is timed, so the processes may share the GPU. All 21 and
# golden took two calls on an H100 (eval/results/2026-11-27-h100-gpu-tests).
# Prepare here (repo root; the paths are git-ignored):
#   SALA_OPENBLAS=off cargo build --release
#   SALA_OPENBLAS=off cargo test --release --no-run --test gpu_kernels --test golden
#   copy sala and the two test binaries (cargo prints their paths) into .device/bin as sala,
#   gpu_kernels and golden; tar cJf .device/bin.tar.xz -C .device bin
#   ../shared/tools/mlx-cuda-bundle .device/mlx-cuda;  cp -r ../shared/golden .device/
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"] (~42 MiB);
#   bash eval/device-tests.sh
# Writes $OUT/gpu_kernels-summary.txt (a line a test), $OUT/gpu_kernels.log (every test's output,
# one after another), $OUT/golden.log and $OUT/device.txt; exits non-zero if any test failed or
# ran out of time.
set -u
source eval/device-setup.sh
JOBS=${JOBS:-10}
# Every test ends by this many seconds after the start (a device call is stopped at 600 without
# handing anything back); GOLDEN=0 leaves golden parity out, TESTS (a grep -E pattern) picks tests.
DEADLINE_S=${DEADLINE_S:-560}
END_AT=$(( $(date +%s) + DEADLINE_S ))
LOGS=$(mktemp -d)
export BIN LOGS END_AT MLX_ENABLE_TF32=0
if [ "${GOLDEN:-1}" = 1 ]; then
  # MLX's CUDA default for f32 matmuls is TF32; golden's tolerances are for full f32.
  SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala XDG_CACHE_HOME=$LOGS/cache-golden \
    timeout "$DEADLINE_S" "$BIN/golden" --test-threads=1 > "$OUT/golden.log" 2>&1 &
fi
# Each test with a self-check memo of its own, so that each process checks every kernel itself;
# output not captured, so that a test stopped at the deadline shows how far it got.
run_one() {
  local start left rc
  start=$(date +%s); left=$((END_AT - start))
  [ "$left" -gt 5 ] || { echo "NOT RUN $1 (deadline)"; return; }
  XDG_CACHE_HOME=$LOGS/cache-$1 timeout "$left" "$BIN/gpu_kernels" --include-ignored --nocapture --exact "$1" > "$LOGS/$1.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q "test result: ok. 1 passed" "$LOGS/$1.log"; then echo "PASS $1 ($(( $(date +%s) - start )) s)"
  elif [ $rc = 124 ]; then echo "TIMEOUT $1 (stopped after $left s)"
  else echo "FAIL $1 (exit $rc)"; fi
}
export -f run_one
# The tiling tests, the longest, first.
"$BIN/gpu_kernels" --include-ignored --list 2>/dev/null | sed -n 's/: test$//p' | grep -E "${TESTS:-.}" > "$LOGS/tests.txt"
{ grep tilings "$LOGS/tests.txt"; grep -v tilings "$LOGS/tests.txt"; } \
  | xargs -P "$JOBS" -I{} bash -c 'run_one {}' | tee "$OUT/gpu_kernels-summary.txt"
for log in "$LOGS"/*.log; do echo "===== $(basename "$log" .log)"; cat "$log"; done > "$OUT/gpu_kernels.log"
wait
[ "${GOLDEN:-1}" = 1 ] && grep -E "^test |test result" "$OUT/golden.log"
FAILED=$(grep -vc '^PASS' "$OUT/gpu_kernels-summary.txt")
echo "gpu_kernels: $(grep -c '^PASS' "$OUT/gpu_kernels-summary.txt") passed, $FAILED not"
[ "$FAILED" = 0 ] && { [ "${GOLDEN:-1}" = 0 ] || grep -q "test result: ok" "$OUT/golden.log"; }
