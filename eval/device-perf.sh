#!/bin/bash
# Issue 6's table on the lent GPU in one call: synthetic MiniCPM-SALA-9B (8-bit, and 4-bit decode)
# through `sala bench`, and mlx-lm (Python) on Qwen3-8B-shaped 8-bit random weights in the same
# run. Prefill = an N-token prompt in 2048-token steps; decode = 64 tokens after an N-token prompt.
# Prepare on the CPU machine: SALA_OPENBLAS=off cargo build --release; copy target/release/sala to
# $BIN; ../shared/tools/mlx-cuda-bundle $MLX_BUNDLE --with-python. Carry both.
set -u
BIN=${BIN:-.device/bin}
source ${MLX_BUNDLE:-.device/mlx-cuda-py}/activate.sh
OUT=${OUT:-/tmp}
CONTEXTS=${CONTEXTS:-4096,32768,131008}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/device.txt
bench() { $BIN/sala bench --synthetic "$@" -r ${R:-1} -o csv --output-file $OUT/sala.csv 2>&1 | grep -v "^appended"; }
bench minicpm-sala-9b --bits 8 -p $CONTEXTS -n 0
# Decode: 3 runs each (single 64-token runs on the lent H100s varied by up to ±20 %).
R=3 bench minicpm-sala-9b --bits 8 -p 0 -n 64 -d $CONTEXTS
R=3 bench minicpm-sala-9b --bits 4 -p 0 -n 64 -d 4096
python3 eval/mlx_lm_baseline.py eval/synthetic/qwen3-8b.json 8 $CONTEXTS $OUT/mlx_lm.csv 2>&1 | grep -v Warning
# Batched decode: aggregate tok/s of 8 sequences against one (target ≥ 5×).
R=3 bench minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 --n-seq 1,8
# LONG=1: the 1M-token prompt (2 × 2.7 minutes at 8a59644: bench warms up with a full run first), on a copy
# of the 9B config allowing 1,048,576 positions.
if [ "${LONG:-0}" = 1 ]; then
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('$OUT/minicpm-sala-9b-1m.json', 'w'))"
  bench $OUT/minicpm-sala-9b-1m.json --bits 8 -p 1048576 -n 0
fi
