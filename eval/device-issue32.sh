#!/bin/bash
# Issue 32 on one lent GPU, one call: the build with the new mlx-sys (mlx-c compiled by the cc
# crate, bindings checked in) linked against the CUDA libmlx passes the golden cases on the GPU;
# every kernel passes its self-check and broken variants are switched off; a passed check is
# remembered, so a second process of the same binary starts without compiling the checks.
# Prepare here (repo root):
#   SALA_OPENBLAS=off cargo build --release && SALA_OPENBLAS=off cargo test --release --no-run --test golden --test gpu_kernels
#   mkdir -p .device/bin && cp target/release/sala <golden and gpu_kernels test binaries> .device/bin/ && strip .device/bin/*
#   tar cJf .device/bin.tar.xz -C .device bin; cp -r ../shared/golden .device/; ../shared/tools/mlx-cuda-bundle
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"]; bash eval/device-issue32.sh
set -u
tar xJf .device/bin.tar.xz -C .device
BIN=.device/bin
source .device/mlx-cuda/activate.sh
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
export MLX_ENABLE_TF32=0
# Golden parity on the GPU with this build (the tests read ../shared/golden from SALA_SHARED).
SALA_TEST_DEVICE=gpu SALA_SHARED=.device XDG_CACHE_HOME=$OUT/cache-golden $BIN/golden --test-threads=1 2>&1 | tee "$OUT/golden.log" | grep -E "^test |test result"
# Self-checks afresh and broken variants switched off.
XDG_CACHE_HOME=$OUT/cache-tests $BIN/gpu_kernels --include-ignored --test-threads=1 --nocapture every_kernel_passes broken_ 2>&1 \
  | tee "$OUT/selfcheck.log" | grep -E "^test |test result|Verified|Disabled|warning"
# The memo: two processes of `sala run` (golden C) with one empty cache folder, then the memo's lines.
G=.device/golden/C_sparse_prefill
IDS=$(python3 -c "import json; print(','.join(map(str,json.load(open('$G/tokens.json'))['prompt_ids'])))")
for n in 1 2; do
  start=$(date +%s.%N)
  XDG_CACHE_HOME=$OUT/cache-memo $BIN/sala run --model "$G" --input-ids "$IDS" --temperature 0 --ignore-eos --max-tokens 4 \
    --dtype f32 --device gpu --logits-out "$OUT/memo-$n.safetensors" > "$OUT/memo-$n.log" 2>&1
  rc=$?
  echo "sala run #$n: $(python3 -c "import time; print(f'{time.time() - $start:.1f}')") s, exit $rc"
done | tee "$OUT/memo.txt"
cmp -s "$OUT/memo-1.safetensors" "$OUT/memo-2.safetensors" && echo "logits of run 1 and 2 identical" | tee -a "$OUT/memo.txt"
echo "memo lines: $(wc -l < $OUT/cache-memo/sala/kernel-checks)" | tee -a "$OUT/memo.txt"
cp $OUT/cache-memo/sala/kernel-checks "$OUT/kernel-checks.txt"
