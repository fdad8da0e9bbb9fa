#!/bin/bash
# Issue 60's table on one lent H200, one call: prefill of synthetic MiniCPM-SALA-9B and Qwen3-8B at
# 8 and 4 bits (pp4096, pp32768, pp131072; `sala bench -n 0 -d 0 -r 1`, MLX's peak memory in the
# CSV), then the 1,048,576-token SALA-9B 8-bit prompt (its preset with max_position_embeddings
# 1048576) while nvidia-smi samples the GPU's memory every 500 ms. TPS="1 2" on a two-GPU machine
# (nvidia-h200-x2) adds the 1M prompt at --tp 2. Every step has its own timeout, so the call ends
# inside the device's 10 minutes (about 6 on one H200: each process builds its model in ~12 s, and
# every test runs twice, a warm-up first: the 1M prompt takes ~200 s).
# Prepare here (repo root): an SALA_OPENBLAS=off build of sala in .device/bin, stripped,
#   tar cf - -C .device bin | xz -9 > .device/bin.tar.xz; ../shared/tools/mlx-cuda-bundle
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-prefill-table.sh
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu-memory.csv" &
SMI=$!
bench() {
  local limit=$1; shift
  timeout "$limit" $BIN/sala bench "$@" -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err" | grep -v "^appended"
  phase "bench $* rc=${PIPESTATUS[0]}"
}
for model in minicpm-sala-9b qwen3-8b; do
  for bits in 8 4; do
    bench 120 --synthetic $model --bits $bits -p 4096,32768,131072 -n 0 -d 0 -r 1
  done
done
python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('$OUT/minicpm-sala-9b-1m.json', 'w'))"
for tp in ${TPS:-1}; do
  bench 300 --tp "$tp" --synthetic "$OUT/minicpm-sala-9b-1m.json" --bits 8 -p 1048576 -n 0 -d 0 -r 1
done
kill $SMI
cut -d, -f1-12 "$OUT/prefill.csv"
