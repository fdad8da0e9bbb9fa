#!/bin/bash
# Issue 60, after eval/device-prefill-table.sh on the same warm machine (its SALA-9B 8-bit row ran
# out of time compiling kernels on a fresh machine): that row, Qwen3-8B pp32768 with --prompt-fp8,
# cuDNN's attention alone in bf16 and FP8 on Qwen3-8B's shapes (eval/cudnn_sdpa_fp8.cu, built here
# while the benches run), golden parity on the GPU (f32), then Nsight Compute's kernel times of
# Qwen3-8B's 32K prompt with what is left.
# Prepare here: an SALA_OPENBLAS=off build of sala and the golden test binary
# (SALA_OPENBLAS=off cargo test --release --no-run --test golden) in .device/bin as sala and golden,
# stripped, tar cf - -C .device bin | xz > .device/bin.tar.xz; cp -r ../shared/golden .device/;
# PyPI nvidia-cudnn-frontend's include/ folder as cudnn-frontend/include in .device/cudnn-frontend.tar.xz.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden", ".device/cudnn-frontend.tar.xz"]
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
trap - EXIT
END_AT=$(( $(date +%s) + ${CALL_SECONDS:-560} ))
left() { echo $(( END_AT - $(date +%s) )); }
NV=/tmp/mlx-cuda/nvidia
NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
CUDA_LIB=$(dirname "$(dirname "$NVCC")")/lib64
( tar xJf .device/cudnn-frontend.tar.xz -C /tmp && nice "$NVCC" -O2 -std=c++17 -arch=sm_90 -I/tmp/cudnn-frontend/include \
    -I$NV/cudnn/include eval/cudnn_sdpa_fp8.cu -L$NV/cudnn/lib -l:libcudnn.so.9 \
    -L$CUDA_LIB -lnvrtc -lcuda -o /tmp/cudnn_sdpa_fp8 ) > "$OUT/cudnn-build.log" 2>&1 &
CUDNN_BUILD=$!
bench() {
  local limit=$1; shift
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -gt 10 ] || { phase "skipped $* (no time left)"; return; }
  timeout "$limit" $BIN/sala bench "$@" -n 0 -d 0 -r 1 -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err" | grep -v "^appended"
  phase "bench $* rc=${PIPESTATUS[0]}"
}
bench 120 --synthetic minicpm-sala-9b --bits 8 -p 4096,32768,131072
bench 60 --synthetic qwen3-8b --bits 8 -p 32768 --prompt-fp8
wait $CUDNN_BUILD
phase "cudnn_sdpa_fp8 build rc=$?"; tail -5 "$OUT/cudnn-build.log"
[ -x /tmp/cudnn_sdpa_fp8 ] && LD_LIBRARY_PATH=$NV/cudnn/lib:$CUDA_LIB:$LD_LIBRARY_PATH timeout 60 /tmp/cudnn_sdpa_fp8 4096 32768 2>&1 | tee "$OUT/cudnn-sdpa.csv"
phase "cudnn_sdpa_fp8 rc=${PIPESTATUS[0]}"
# MLX's CUDA default for f32 matmuls is TF32; golden's tolerances are for full f32.
MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala XDG_CACHE_HOME=/tmp/cache-golden \
  timeout $(( $(left) - 100 )) "$BIN/golden" --test-threads=1 > "$OUT/golden.log" 2>&1
phase "golden rc=$?"; grep -E "^test |test result" "$OUT/golden.log"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
limit=$(( $(left) - 5 ))
if [ "$limit" -gt 30 ]; then
  timeout "$limit" "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum --log-file "$OUT/ncu-qwen3.csv" \
    $BIN/sala bench --synthetic qwen3-8b --bits 8 -p 32768 -n 0 -d 0 -r 1 > /dev/null 2>&1
  phase "ncu qwen3 rc=$?"
  python3 eval/ncu_step.py --all "$OUT/ncu-qwen3.csv" > "$OUT/ncu-qwen3.md" && head -30 "$OUT/ncu-qwen3.md"
  xz -f "$OUT/ncu-qwen3.csv"
fi
cut -d, -f1-12 "$OUT/prefill.csv"
