#!/bin/bash
# Issue 33 on two GPUs of one host (nvidia-h100-x2): tensor parallelism over NCCL against one GPU,
# in one machine's calls. `quick`: the collective check, synthetic MiniCPM-SALA-9B 8-bit prefill
# 32K and decode @4K/@128K at --tp 1 and --tp 2, the golden cases over two GPUs against the
# reference and one GPU. `decode`: decode @4K of 1 and 8 sequences. `long`: the 1M-token prompt
# at --tp 2 and --tp 1 (TPS="2" or "1" for one of them). nvidia-smi samples both
# GPUs' memory every 500 ms throughout (per-GPU peak).
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo build --release && SALA_OPENBLAS=off cargo test --release --no-run --test tensor_parallel
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && cp <tensor_parallel test binary> .device/bin/tensor_parallel
#   strip .device/bin/* && tar cJf .device/bin.tar.xz -C .device bin; cp -r ../shared/golden .device/; ../shared/tools/mlx-cuda-bundle
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-tp.sh quick|long
set -u
tar xJf .device/bin.tar.xz -C .device
BIN=.device/bin
source .device/mlx-cuda/activate.sh
OUT=${OUT:-/tmp}
# NVLink multicast stays off (the host's GPUs are shared); sala's launcher sets it too.
export NCCL_NVLS_ENABLE=0
# One kernel self-check memo for every process of this binary.
export XDG_CACHE_HOME=$OUT/cache
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu-memory-$1.csv" &
SMI=$!
phase() { echo "$(date +%s.%N) $*" >> "$OUT/phases-$1.txt"; }
bench() {
  local tp=$1; shift
  phase "$MODE" "start tp$tp $*"
  $BIN/sala bench --tp "$tp" "$@" -o csv --output-file "$OUT/sala-tp.csv" 2>&1 | grep -v "^appended"
  phase "$MODE" "end tp$tp $*"
}
MODE=$1
case "$MODE" in
quick)
  $BIN/sala doctor --tp 2 2>&1 | tee "$OUT/doctor-tp2.txt"
  for tp in 1 2; do
    bench $tp --synthetic minicpm-sala-9b --bits 8 -p 32768 -n 0 -r 2
    bench $tp --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096,131072 -r 3
  done
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala $BIN/tensor_parallel --test-threads=1 --nocapture \
    golden_cases a_quantized ranks_that 2>&1 | tee "$OUT/golden-tp.log" | grep -E "^test |test result|Δlogit|panicked"
  ;;
decode)
  # After the review of the first run: decode at 4K again, one and eight sequences.
  for tp in 1 2; do
    bench $tp --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 --n-seq 1,8 -r 3
  done
  ;;
gpu-tests)
  # Every tensor_parallel test but SmolLM2's (its GGUF is not carried) on two GPUs over NCCL, then
  # the dense Qwen3-8B shape at --tp 1 and --tp 2.
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala $BIN/tensor_parallel --test-threads=1 --nocapture \
    --skip smollm2 --skip heads_that 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "^test |test result|Δlogit|panicked"
  for tp in 1 2; do
    bench $tp --synthetic qwen3-8b --bits 8 -p 32768 -n 64 -r 2
  done
  ;;
long)
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('$OUT/minicpm-sala-9b-1m.json', 'w'))"
  for tp in ${TPS:-2 1}; do
    bench $tp --synthetic "$OUT/minicpm-sala-9b-1m.json" --bits 8 -p 1048576 -n 0 -r 1
  done
  ;;
esac
kill $SMI
cat "$OUT/sala-tp.csv" | cut -d, -f1,5,8,9,10,18,22
