#!/bin/bash
# Issue 60: does a larger prompt chunk speed prefill? The models multiply a chunk by each
# dequantized matrix with cuBLASLt's bf16 GEMM, which reached only 320–420 TFLOP/s on 2048-row
# chunks (eval/results/2026-12-02-h200-qmm-i8). `sala bench` prefill of Qwen3-8B's and
# MiniCPM-SALA-9B's shapes at BITS (default 8) and PROMPTS (default 4096,32768), one run a
# `--prefill-step` in STEPS (default "2048 4096 8192"), with peak memory; then `kernels qmm-i8`
# for the products alone at 2048 rows (QMM=0 skips it); `kernels prefill ROWS 32` (the pieces of
# one SALA chunk at 32K) per step; and eval/gemm-ceiling.py (PyTorch's bf16 and FP8 GEMMs on the
# same products, the ceiling outside MLX; CEILING=0 skips it).
# Prepare here: SALA_OPENBLAS=off cargo build --release; SALA_OPENBLAS=off cargo bench --bench kernels --no-run;
#   sala and the kernels binary (as kernels) in .device/bin, stripped; tar cJf .device/bin.tar.xz -C .device bin.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-prefill-chunks.sh
# Back in $OUT: pp-step-N.md (bench's table) and .err, pieces-N.md, qmm-i8.md, gemm-ceiling.md,
# phases.txt, device.txt.
set -u
source eval/device-setup.sh
for step in ${STEPS:-2048 4096 8192}; do
  timeout "${BENCH_SECONDS:-200}" $BIN/sala bench --synthetic qwen3-8b --synthetic minicpm-sala-9b --bits "${BITS:-8}" \
    -p "${PROMPTS:-4096,32768}" -n 0 -d 0 -r "${REPS:-1}" --prefill-step "$step" > "$OUT/pp-step-$step.md" 2> "$OUT/pp-step-$step.err"
  phase "prefill step $step rc=$?"
  cat "$OUT/pp-step-$step.md"
done
if [ "${QMM:-1}" = 1 ]; then
  timeout 90 $BIN/kernels qmm-i8 > "$OUT/qmm-i8.md" 2>&1
  phase "qmm-i8 rc=$?"
fi
for step in ${STEPS:-2048 4096 8192}; do
  timeout 120 $BIN/kernels prefill "$step" 32 > "$OUT/pieces-$step.md" 2>&1
  phase "pieces $step rc=$?"
  cat "$OUT/pieces-$step.md"
done
if [ "${CEILING:-1}" = 1 ]; then
  timeout 150 python3 eval/gemm-ceiling.py "${CEILING_ROWS:-2048,4096,8192}" > "$OUT/gemm-ceiling.md" 2>&1
  phase "gemm-ceiling rc=$?"
  cat "$OUT/gemm-ceiling.md"
fi
rm -rf "$OUT/cache"
