#!/bin/bash
# Issue 60, the call after eval/device-prefill-table.sh on the same warm machine: golden parity on
# the GPU (tests/golden.rs, f32) while llama.cpp builds, nothing timed meanwhile; llama.cpp's
# prefill on a Qwen3-8B-shaped Q8_0 model (pp4096, pp32768) beside `sala bench` of synthetic Qwen3-8B
# and MiniCPM-SALA-9B 8-bit in the same call, exact and with --prompt-fp8; then, for the goals
# not met, cuDNN's attention alone in bf16 and FP8 on Qwen3-8B's shapes (eval/cudnn_sdpa_fp8.cu,
# built here meanwhile) and every kernel of a 32K prompt under Nsight Compute, summed by name
# (eval/ncu_step.py).
# Prepare here: as eval/device-prefill-table.sh with the golden test binary in .device/bin as golden
# (SALA_OPENBLAS=off cargo test --release --no-run --test golden), cp -r ../shared/golden .device/,
# ../shared/tools/llamacpp-bench/prepare .llamacpp-bench, and PyPI nvidia-cudnn-frontend's include/
# folder as cudnn-frontend/include in .device/cudnn-frontend.tar.xz
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden", ".llamacpp-bench",
#   ".device/cudnn-frontend.tar.xz"]
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
trap - EXIT
END_AT=$(( $(date +%s) + ${CALL_SECONDS:-585} ))
left() { echo $(( END_AT - $(date +%s) )); }
mkdir -p "$OUT/llamacpp"
# MLX's CUDA default for f32 matmuls is TF32; golden's tolerances are for full f32.
MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala XDG_CACHE_HOME=/tmp/cache-golden \
  timeout 240 "$BIN/golden" --test-threads=1 > "$OUT/golden.log" 2>&1 &
GOLDEN=$!
NV=/tmp/mlx-cuda/nvidia
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
( tar xJf .device/cudnn-frontend.tar.xz -C /tmp && "$NVCC" -O2 -std=c++17 -arch=sm_90 -I/tmp/cudnn-frontend/include \
    -I$NV/cudnn/include eval/cudnn_sdpa_fp8.cu -L$NV/cudnn/lib -l:libcudnn.so.9 -o /tmp/cudnn_sdpa_fp8 ) > "$OUT/cudnn-build.log" 2>&1 &
CUDNN_BUILD=$!
# PP empty: the build and the model only, beside golden; the timed runs after it.
OUT="$OUT/llamacpp" PP= TG= DEPTHS= DEEP= bash .llamacpp-bench/run.sh > /dev/null 2>&1
phase "llama.cpp build rc=$?"
wait $GOLDEN
phase "golden rc=$?"; grep -E "^test |test result" "$OUT/golden.log"
OUT="$OUT/llamacpp" TG= DEPTHS= DEEP= REPS=${LLAMA_REPS:-2} BUDGET_S=${LLAMA_SECONDS:-120} \
  bash .llamacpp-bench/run.sh > /dev/null 2>&1
phase "llama.cpp rc=$?"
bench() {
  local limit=$1; shift
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -gt 10 ] || { phase "skipped $* (no time left)"; return; }
  timeout "$limit" $BIN/sala bench "$@" -n 0 -d 0 -r 1 -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err" | grep -v "^appended"
  phase "bench $* rc=${PIPESTATUS[0]}"
}
bench 60 --synthetic qwen3-8b --bits 8 -p 4096,32768
bench 60 --synthetic qwen3-8b --bits 8 -p 4096,32768 --prompt-fp8
bench 60 --synthetic minicpm-sala-9b --bits 8 -p 32768 --prompt-fp8
wait $CUDNN_BUILD
phase "cudnn_sdpa_fp8 build rc=$?"; tail -5 "$OUT/cudnn-build.log"
[ -x /tmp/cudnn_sdpa_fp8 ] && LD_LIBRARY_PATH=$NV/cudnn/lib:$LD_LIBRARY_PATH timeout 60 /tmp/cudnn_sdpa_fp8 4096 32768 2>&1 | tee "$OUT/cudnn-sdpa.csv"
phase "cudnn_sdpa_fp8 rc=${PIPESTATUS[0]}"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for model in qwen3-8b minicpm-sala-9b; do
  limit=$(( $(left) - 5 ))
  [ "$limit" -gt 30 ] || { phase "skipped ncu $model"; continue; }
  timeout "$limit" "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum --log-file "$OUT/ncu-$model.csv" \
    $BIN/sala bench --synthetic $model --bits 8 -p 32768 -n 0 -d 0 -r 1 > /dev/null 2>&1
  phase "ncu $model rc=$?"
  python3 eval/ncu_step.py --all "$OUT/ncu-$model.csv" > "$OUT/ncu-$model.md" && head -30 "$OUT/ncu-$model.md"
  xz -f "$OUT/ncu-$model.csv"
done
cat "$OUT/llamacpp/results.md" 2>/dev/null
cut -d, -f1-12 "$OUT/prefill.csv"
