#!/bin/bash
# Issue 60, one H200 call after a change to a prompt chunk's sparse attention or block selection:
#   1. the GPU tests of TESTS (a grep -E pattern of tests/gpu_kernels.rs; default the prefill
#      attention's and every kernel's self-check) and golden parity on the GPU (eval/device-tests.sh);
#   2. the kernels bench's pieces of a 2048-token chunk at PIECES_AT (K tokens, default 32,1024);
#   3. the selection's kernels at a 1M context alone under Nsight Compute (time, SM, L2, memory,
#      tensor pipe, occupancy limits), a few launches of each: which of the level-2 sums, the window
#      scores and the pooling with top-k holds the time;
#   4. `sala bench` prefill of synthetic MiniCPM-SALA-9B 8-bit at 4K, 32K and 128K, then the
#      1,048,576-token prompt (eval/device-prefill-table.sh's config) with MLX's peak in the CSV.
# Prepare here: SALA_OPENBLAS=off builds of sala, the kernels bench and the gpu_kernels and golden
# test binaries in .device/bin (as sala, kernels, gpu_kernels, golden), stripped;
#   tar cf - -C .device bin | xz -9 > .device/bin.tar.xz; cp -r ../shared/golden .device/;
#   ../shared/tools/mlx-cuda-bundle
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"];
#   bash eval/device-prefill-select.sh       (ONE_M=0 leaves the 1M prompt out, ~170 s; NCU_SELECT=0 step 3;
#   BENCH_PROMPTS= step 4's shorter prompts, or other lengths)
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
# Nothing comes back but the results (a call returns at most 8 files; the kernel cache is too large).
trap - EXIT
TESTS=${TESTS:-'block_sparse_attention_kernel_matches_mlx|every_kernel_passes'} DEADLINE_S=${TEST_SECONDS:-240} bash eval/device-tests.sh
phase "tests rc=$?"
timeout 150 $BIN/kernels prefill 2048 ${PIECES_AT:-32,1024} > "$OUT/pieces.md" 2>&1
phase "pieces rc=$?"
cat "$OUT/pieces.md"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "${NCU_SELECT:-1}" = 1 ]; then
  # The bfloat16 path's launches come first in the bench's selection rows (warm-up included).
  timeout 120 "$NCU" --clock-control none --csv --launch-count 12 -k "regex:select" \
    --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__registers_per_thread,launch__grid_size,launch__block_size,smsp__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
    --log-file "$OUT/ncu-select.csv" $BIN/kernels prefill 2048 1024 > /dev/null 2>&1
  phase "ncu select rc=$?"
  python3 - "$OUT/ncu-select.csv" <<'EOF' | tee "$OUT/ncu-select.md"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
ki, mi, ui, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
ids = head.index("ID")
seen = {}
for r in body:
    seen.setdefault((r[ids], r[ki][:60]), {})[r[mi]] = f"{r[vi]} {r[ui]}".strip()
for (i, k), m in seen.items():
    print(f"## launch {i}: {k}")
    for name, value in sorted(m.items()):
        print(f"- {name}: {value}")
EOF
fi
if [ -n "${BENCH_PROMPTS-4096,32768,131072}" ]; then
  timeout 120 $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 -p "${BENCH_PROMPTS-4096,32768,131072}" -n 0 -d 0 -r 1 -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err"
  phase "bench rc=$?"
fi
if [ "${ONE_M:-1}" = 1 ]; then
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('/tmp/minicpm-sala-9b-1m.json', 'w'))"
  timeout 300 $BIN/sala bench --synthetic /tmp/minicpm-sala-9b-1m.json --bits 8 -p 1048576 -n 0 -d 0 -r 1 -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err"
  phase "bench 1M rc=$?"
fi
[ -f "$OUT/prefill.csv" ] && python3 - "$OUT/prefill.csv" <<'EOF'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f'{r["model_filename"]} pp{r["n_prompt"]}: {float(r["avg_ts"]):,.0f} tok/s, {int(r["avg_ns"]) / 1e9:.2f} s, peak {int(r["peak_mem"]) / 1e9:.2f} GB')
EOF
