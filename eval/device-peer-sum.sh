#!/bin/bash
# Issue 61 on two GPUs of one host (nvidia-h200-x2): tensor parallelism's sums through peer
# memory (kernels::all_reduce) against NCCL's, in one call on one machine.
#   1. `sala doctor --tp 2`: the decode (88 × 8 KiB) and prefill (16 × 16 MiB) chains through peer
#      memory, and through NCCL alone.
#   2. tests/tensor_parallel.rs on the GPUs (SALA_TEST_DEVICE=gpu): sums_go_through_peer_memory_on_gpus,
#      the golden cases over two GPUs (through the new sums) and the 8-bit model.
#   3. `sala bench` decode of synthetic MiniCPM-SALA-9B 8-bit @4K and @128K and Qwen3-8B 8-bit @4K at
#      --tp 1, --tp 2, and --tp 2 with SALA_PEER_SUM=off (NCCL); prefill 32K at --tp 1 and 2.
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo build --release && SALA_OPENBLAS=off cargo test --release --no-run --test tensor_parallel
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && cp <tensor_parallel test binary> .device/bin/tensor_parallel
#   strip .device/bin/* && tar cf - -C .device bin | xz -9 > .device/bin.tar.xz; cp -r ../shared/golden .device/
#   ../shared/tools/mlx-cuda-bundle
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"], kind nvidia-h200-x2;
#   bash eval/device-peer-sum.sh            (QUICK=1: doctor and tests only)
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
# NVLink multicast stays off (the host's GPUs are shared); sala's launcher sets it too.
export NCCL_NVLS_ENABLE=0
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
timeout 240 $BIN/sala doctor --tp 2 2>&1 | tee "$OUT/doctor-tp2.txt"
phase "doctor rc=${PIPESTATUS[0]}"
MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala timeout 400 $BIN/tensor_parallel --test-threads=1 --nocapture \
  sums_go_through golden_cases_over_two a_quantized 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "^test |test result|Δlogit|panicked|skipped|warning"
phase "tests rc=${PIPESTATUS[0]}"
[ "${QUICK:-0}" = 1 ] && exit 0
bench() {
  local label=$1; shift
  echo "## $label" >> "$OUT/bench.md"
  timeout 240 "$@" 2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
  phase "bench $label rc=${PIPESTATUS[0]}"
}
sala_decode="--synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096,131072 -r 2"
qwen_decode="--synthetic qwen3-8b --bits 8 -p 0 -n 64 -d 4096 -r 2"
bench "SALA-9B decode, --tp 1" $BIN/sala bench --tp 1 $sala_decode
bench "SALA-9B decode, --tp 2 (peer memory)" $BIN/sala bench --tp 2 $sala_decode
bench "SALA-9B decode, --tp 2 (NCCL: SALA_PEER_SUM=off)" env SALA_PEER_SUM=off $BIN/sala bench --tp 2 $sala_decode
bench "Qwen3-8B decode, --tp 1" $BIN/sala bench --tp 1 $qwen_decode
bench "Qwen3-8B decode, --tp 2 (peer memory)" $BIN/sala bench --tp 2 $qwen_decode
bench "Qwen3-8B decode, --tp 2 (NCCL)" env SALA_PEER_SUM=off $BIN/sala bench --tp 2 $qwen_decode
bench "SALA-9B prefill 32K, --tp 1" $BIN/sala bench --tp 1 --synthetic minicpm-sala-9b --bits 8 -p 32768 -n 0 -d 0 -r 1
bench "SALA-9B prefill 32K, --tp 2" $BIN/sala bench --tp 2 --synthetic minicpm-sala-9b --bits 8 -p 32768 -n 0 -d 0 -r 1
