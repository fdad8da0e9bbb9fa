#!/bin/bash
# Issue 34: SALA's sparse layers at long-context decode, one GPU, one call. The GPU kernel tests
# named in TEST_FILTER (default: the block selection against its MLX oracle, every self-check);
# then `kernels sparse-step` (one sparse layer's decode step on random caches of LENGTHS tokens:
# append, pooled keys, selection, attention) with the bench built before the change
# (kernels-base) and after (kernels), alternating (STEP_BINS names others). DECODE_ATTENTION=1:
# `kernels decode-attention` first (dense decode attention, tensor cores against CUDA cores).
# PROFILE=1: the kernels of one sparse layer's decode step on random caches of PROFILE_LENGTHS tokens under Nsight Compute (`kernels sparse-profile`: one
# step per tiling of the window scores, listed by eval/ncu_sparse.py), for the benches in
# PROFILE_BINS. BENCH=1: `sala bench` decode of the synthetic SALA-9B q8 at DEPTHS (default 4K
# and 1M; a copy of its config allowing 1M + 8K positions) with each of BENCH_BINS (default sala;
# sala-base: the build before the change), then NSEQ=1 the batched decode of 1 and 16 sequences
# at 4K, with each of BENCH_BINS. QMM_SWEEP=1: the tensor-core products' tilings at 16 input rows
# (a batch of 16) under Nsight Compute, one run per product of QMM_PRODUCTS (`kernels qmv-tiling 8
# PRODUCT 16`, eval/qmv_tiling.py), each at most QMM_SECONDS, with each bench of QMM_BINS (default
# kernels).
# Prepare here (repo root): SALA_OPENBLAS=off cargo bench --bench kernels --no-run (before and
#   after the change) and cargo test --release --no-run --test gpu_kernels; copy them to
#   .device/bin as kernels-base, kernels and gpu_kernels, `strip --strip-debug`;
#   tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-sparse-long.sh
set -u
source eval/device-setup.sh
if [ "${TESTS:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 $BIN/gpu_kernels --include-ignored --test-threads=1 ${TEST_FILTER:-block_selection every_kernel} 2>&1 \
    | tee "$OUT/gpu_kernels.log" | grep -E "^test |test result|panicked|relative error"
fi
if [ "${DECODE_ATTENTION:-0}" = 1 ]; then
  $BIN/kernels decode-attention 2>&1 | grep "^|" | tee "$OUT/decode-attention.md"
fi
for round in $(seq "${ROUNDS:-1}"); do
  for bin in ${STEP_BINS:-kernels-base kernels}; do
    echo "== $bin round $round"
    $BIN/$bin sparse-step ${LENGTHS:-131072 1048576} 2>&1 | grep "^|" | tee -a "$OUT/sparse-step-$bin.md"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  for bin in ${PROFILE_BINS:-kernels}; do
    timeout 240 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --profile-from-start off \
      --log-file "$OUT/ncu-sparse-$bin.csv" $BIN/$bin sparse-profile ${PROFILE_LENGTHS:-1048576} > /dev/null 2>&1
    python3 eval/ncu_sparse.py "$OUT/ncu-sparse-$bin.csv" | tee "$OUT/ncu-sparse-$bin.txt"
  done
fi
if [ "${BENCH:-0}" = 1 ]; then
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576 + 8192; json.dump(c, open('$OUT/minicpm-sala-9b-1m.json', 'w'))"
  for bin in ${BENCH_BINS:-sala}; do
    echo "== $bin"
    $BIN/$bin bench --synthetic "$OUT/minicpm-sala-9b-1m.json" --bits 8 -p 0 -n 64 -d ${DEPTHS:-4096,1048576} -r 1 \
      -o csv --output-file "$OUT/$bin-long.csv" 2>&1 | grep -v "^appended"
  done
fi
if [ "${QMM_SWEEP:-0}" = 1 ]; then
  # One Nsight run per product (all of them in one run, the output head included, outlasts a call).
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  for bin in ${QMM_BINS:-kernels}; do
    for product in ${QMM_PRODUCTS:-gate down qkvz o_proj}; do
      echo "== $bin"
      timeout "${QMM_SECONDS:-150}" "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --profile-from-start off \
        --log-file "$OUT/ncu-tiling-$bin-$product.csv" $BIN/$bin qmv-tiling 8 "$product" 16 > "$OUT/tiling-$bin-$product.txt" 2>/dev/null
      python3 eval/qmv_tiling.py "$OUT/tiling-$bin-$product.txt" "$OUT/ncu-tiling-$bin-$product.csv" | tee "$OUT/qmv-tiling-q8-rows16-$bin-$product.txt"
      xz -f "$OUT/ncu-tiling-$bin-$product.csv"
    done
  done
fi
if [ "${NSEQ:-0}" = 1 ]; then
  for bin in ${BENCH_BINS:-sala}; do
    echo "== $bin"
    $BIN/$bin bench --synthetic minicpm-sala-9b --bits 8 -p 0 -n 64 -d 4096 --n-seq 1,16 -r 3 \
      -o csv --output-file "$OUT/$bin-batch.csv" 2>&1 | grep -v "^appended"
  done
fi
