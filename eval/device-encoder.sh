#!/bin/bash
# Issue 34: decode steps encoded on the evaluator thread (engine::encoder) against this thread
# (SALA_ENCODER=off), one binary, the two alternating so that drift of the machine's host falls
# on both. First the GPU runs of what the change touches: greedy decoding on the device against
# host greedy (tests/speculative.rs), batching, and golden parity through `sala run`.
# Prepare here (repo root): SALA_OPENBLAS=off cargo build --release; cargo test --release --no-run
#   --test speculative --test golden --test batching --test encoder; copy sala and those test binaries into
#   .device/bin, strip them, tar cJf .device/bin.tar.xz -C .device bin; copy ../shared/golden to
#   .device/golden (the SmolLM2 cases need a download, so they do not run there).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"];
#   bash eval/device-encoder.sh            (TESTS=0 skips the tests, ROUNDS sets the A/B rounds)
set -u
source eval/device-setup.sh
ROUNDS=${ROUNDS:-2}
if [ "${TESTS:-1}" = 1 ]; then
  export MLX_ENABLE_TF32=0 SALA_SHARED=.device SALA_BIN=$BIN/sala
  $BIN/speculative --test-threads=1 stops_leave 2>&1 | tee "$OUT/speculative.log" | grep -E "^test |test result|panicked"
  $BIN/batching --test-threads=1 sala_ lightning 2>&1 | tee "$OUT/batching.log" | grep -E "^test |test result|panicked"
  $BIN/encoder --test-threads=1 sala_ a_ 2>&1 | tee "$OUT/encoder.log" | grep -E "^test |test result|panicked"
  SALA_TEST_DEVICE=gpu $BIN/golden --test-threads=1 sala_run c_decode d_two_turn 2>&1 | tee "$OUT/golden.log" | grep -E "^test |test result|panicked"
  unset MLX_ENABLE_TF32
fi
bench() { # label, encoder setting, model args...
  local label=$1 setting=$2
  shift 2
  echo "== $label encoder=$setting"
  SALA_ENCODER=$setting $BIN/sala bench "$@" -o csv --output-file "$OUT/$label-$setting.csv" 2>&1 | grep -v "^appended" | tail -4
}
for round in $(seq "$ROUNDS"); do
  for setting in off on; do
    bench qwen3-q8 $setting --synthetic qwen3-8b --bits 8 -p 0 -n 64 -d 4096,32768 -r 2 --draft-layers 0
  done
done
for setting in off on; do
  bench sala-q8 $setting --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 -r 3 --draft-layers 0
  bench sala-q4 $setting --synthetic minicpm-sala-9b --bits 4 -p 0 -n 64 -d 4096 -r 3
done
