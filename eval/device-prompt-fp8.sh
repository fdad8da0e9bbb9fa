#!/bin/bash
# Issue 60, the FP8 prompt products (cuda/fp8_gemm.cu, `--prompt-fp8`) on one H200 in one call:
#   1. GPU tests of TESTS (default: the FP8 product against its oracle and every kernel's
#      self-check) and golden parity on the GPU (the exact path: eval/device-tests.sh);
#   2. `kernels fp8`: the product against the models' exact path for prompt chunks (dequantize,
#      then MLX's bf16 matmul) at SALA-9B's and Qwen3-8B's shapes;
#   2b. (NCU_GEMM=1, the default) each FP8 kernel once under Nsight Compute: speed of light, warp
#      stalls, occupancy, memory;
#   3. `sala bench` prefill of synthetic MiniCPM-SALA-9B 8-bit at PROMPTS (default 4096,32768),
#      exact, then with --prompt-fp8, then (QWEN=1) Qwen3-8B 8-bit the same two ways.
# Prepare as eval/device-prefill-select.sh says; carry [".device/bin.tar.xz", ".device/mlx-cuda",
# ".device/golden"].
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
trap - EXIT
TESTS=${TESTS:-'fp8_prompt_product|every_kernel_passes'} DEADLINE_S=${TEST_SECONDS:-200} bash eval/device-tests.sh
phase "tests rc=$?"
grep -h "against the exact" "$OUT/gpu_kernels.log" | tee "$OUT/fp8-test.txt"
timeout 120 $BIN/kernels fp8 > "$OUT/kernels-fp8.md" 2>&1
phase "kernels fp8 rc=$?"
cat "$OUT/kernels-fp8.md"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "${NCU_GEMM:-1}" = 1 ]; then
  # Each FP8 kernel once (rounding x, rounding W, the product in each tiling) on 2048 × 4096 · 4096².
  timeout 150 "$NCU" --clock-control none -k "regex:gemm_e4m3" --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    $BIN/kernels fp8-profile > "$OUT/ncu-fp8.txt" 2>&1
  phase "ncu fp8 rc=$?"
  grep -E "sala_|Duration|Throughput|Pipe|Stall|Warp Cycles|Achieved Occupancy|Registers|Block Limit|Issued|L2 Hit|Bank" "$OUT/ncu-fp8.txt" | head -150
fi
PROMPTS=${PROMPTS:-4096,32768}
for model in minicpm-sala-9b $([ "${QWEN:-0}" = 1 ] && echo qwen3-8b); do
  for fp8 in "" --prompt-fp8; do
    timeout ${BENCH_SECONDS:-300} $BIN/sala bench --synthetic $model --bits 8 -p $PROMPTS -n 0 -d 0 -r 1 $fp8 -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err"
    phase "bench $model $fp8 rc=$?"
  done
done
python3 - "$OUT/prefill.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f'{r["model_filename"]} {r["dtype"]} pp{r["n_prompt"]}: {float(r["avg_ts"]):,.0f} tok/s, {int(r["avg_ns"]) / 1e9:.2f} s, peak {int(r["peak_mem"]) / 1e9:.2f} GB')
PY
