#!/bin/bash
# Issue 60: the block-sparse prefill attention walking its union through a ring of staged tiles
# (cuda/block_sparse_prefill.cu, sala_block_sparse_prefill_ring) against the lockstep walk before
# it, one lease, two calls.
# PART=1: the GPU tests of the attention kernels and every kernel's self-check, golden C (sparse
#   prefill) on the GPU, a SALA chunk's pieces at 32K, 128K and 1M by the kernels bench before
#   (kernels-base) and after, then `sala bench` prefill of SALA-9B 8-bit at 4K and 32K by both.
# PART=2: SALA-9B 4-bit at 4K and 32K by both, 8-bit at 128K by both, and a 1,048,576-token prompt
#   by the new binary (the synthetic config's max_position_embeddings raised to 1M).
# QUICK=1 (with PART=1): the checks (each under TEST_SECONDS), then only the 8-bit prompts, for a
#   lease with little device time left.
# Prepare here: SALA_OPENBLAS=off builds of sala and the kernels bench at this commit and its
#   parent (as sala-base, kernels-base), the gpu_kernels and golden test binaries, in .device/bin,
#   stripped; tar cJf .device/bin.tar.xz -C .device bin; .device/golden holding C_sparse_prefill.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"];
#   PART=1 bash eval/device-attention-ab.sh, then PART=2 on the same (warm) machine.
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
bench() {  # NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  # One file for all runs: the device returns only a few files a call.
  echo "## $name: $bin bench $*" >> "$OUT/bench.md"
  timeout "${BENCH_SECONDS:-240}" $BIN/$bin bench -n 0 -d 0 -r 1 "$@" 2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
  phase "$name rc=${PIPESTATUS[0]}"
}
if [ "${PART:-1}" = 1 ]; then
  MLX_ENABLE_TF32=0 SALA_TEST_DEVICE=gpu SALA_SHARED=.device SALA_BIN=$BIN/sala \
    timeout ${TEST_SECONDS:-300} "$BIN/golden" --test-threads=1 ${GOLDEN_FILTER:-c_sparse} > "$OUT/golden.log" 2>&1 &
  # Side by side (the first compiles many kernels; the GPU has room for all): one log each.
  for t in block_sparse_attention_kernel_matches_mlx block_sparse_attention_reads_an_8_bit_cache_in_place \
    gla_prefill_kernels_match_the_float32_chunked_form every_kernel_passes_its_self_check; do
    # MLX's CUDA float32 matmuls default to TF32; the oracles' tolerances are for full float32.
    (MLX_ENABLE_TF32=0 timeout ${TEST_SECONDS:-280} $BIN/gpu_kernels --include-ignored --exact $t --nocapture > "$OUT/gpu-test-$t.log" 2>&1
     phase "gpu test $t rc=$?") &
  done
  wait; cat "$OUT"/gpu-test-*.log > "$OUT/gpu-tests.log"; rm "$OUT"/gpu-test-*.log; phase "golden: $(grep 'test result' "$OUT/golden.log")"
  grep -E "^test " "$OUT/golden.log"
  if [ "${QUICK:-0}" = 1 ]; then  # the checks, then only the 8-bit prompts by both binaries
    bench q8-base sala-base --synthetic minicpm-sala-9b --bits 8 -p 4096,32768 --prefill-step 2048
    bench q8-new sala --synthetic minicpm-sala-9b --bits 8 -p 4096,32768 --prefill-step 2048
    exit 0
  fi
  for k in kernels-base kernels; do
    timeout 120 $BIN/$k prefill 2048 ${CONTEXTS:-32,128,1024} > "$OUT/pieces-$k.md" 2>&1; phase "pieces $k rc=$?"; cat "$OUT/pieces-$k.md"
  done
  # Each piece's kernels alone: time, and how busy the SMs, L2 and memory were.
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  [ "${NCU_PIECES:-1}" = 1 ] && for k in gla_chunk block_sparse_prefill block_sparse_prefill_wide; do
    [ -n "$NCU" ] && timeout 100 "$NCU" --clock-control none --csv --launch-count 4 -k "regex:$k" \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__shared_mem_config_size,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__registers_per_thread,lts__t_sector_hit_rate.pct,smsp__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      --log-file "$OUT/ncu-$k.csv" $BIN/kernels prefill 2048 32 > /dev/null 2>&1
    phase "ncu $k rc=$?"
  done
  bench q8-base sala-base --synthetic minicpm-sala-9b --bits 8 -p 4096,32768 --prefill-step 2048
  bench q8-new sala --synthetic minicpm-sala-9b --bits 8 -p 4096,32768 --prefill-step 2048
else
  bench q4-base sala-base --synthetic minicpm-sala-9b --bits 4 -p 4096,32768 --prefill-step 2048
  bench q4-new sala --synthetic minicpm-sala-9b --bits 4 -p 4096,32768 --prefill-step 2048
  bench q8-128k-base sala-base --synthetic minicpm-sala-9b --bits 8 -p 131072 --prefill-step 2048
  bench q8-128k-new sala --synthetic minicpm-sala-9b --bits 8 -p 131072 --prefill-step 2048
  # Every kernel of a 4K prompt (two chunks), summed by name: what is left beside the products.
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  [ -n "$NCU" ] && [ "${CHUNK_PROFILE:-1}" = 1 ] && timeout 240 "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum \
    --log-file "$OUT/ncu-chunk.csv" $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 -p 4096 -n 0 -d 0 -r 1 > /dev/null 2>&1
  phase "ncu chunk rc=$?"
  [ -f "$OUT/ncu-chunk.csv" ] && (python3 eval/ncu_step.py --all "$OUT/ncu-chunk.csv" | tee "$OUT/ncu-chunk.md") && xz -f "$OUT/ncu-chunk.csv"
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('$OUT/minicpm-sala-9b-1m.json', 'w'))"
  [ "${MILLION:-1}" = 1 ] && BENCH_SECONDS=200 bench q8-1m-new sala --synthetic "$OUT/minicpm-sala-9b-1m.json" --bits 8 -p 1048576 --prefill-step 2048
fi
true
