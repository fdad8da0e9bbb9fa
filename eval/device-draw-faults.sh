#!/bin/bash
# Issue 58: the served step's draw without zero-filled outputs (cuda/draw.cu since 2026-11-29),
# against the build before, on one lent GPU in one call.
#  0. Beside 1 and 2 (Nsight Compute times each launch alone): the GPU tests named by TESTS (a
#     grep -E pattern; none by default) through eval/device-tests.sh, gpu_kernels from the new tree.
#  1. Every kernel of one draw (1×73448 flat logits, t 0.8, top-p 0.95, the served bench's) under
#     Nsight Compute, MLX's fills and copies included: each kernel's median µs, for each binary
#     of KERNELS (default "kernels kernels-new").
#  2. The draw's own launches on SALA's vocabulary, each stage's median µs (eval/device-draw-profile.sh
#     with ONLY=SALA) for the last binary of KERNELS.
#  3. sala bench of the synthetic SALA-9B at 4K, 4 bits, pipelined and one served stream with
#     --profile, for each binary of BINS (default "sala sala-new"), alternating, ROUNDS (2) times
#     (a round only while the call has 120 s left of ROUND_BY, 430 s after the start).
# Prepare (repo root, git-ignored): .device/bin with the binaries named (SALA_OPENBLAS=off release
#   builds; kernels from target/release/deps/kernels-*), stripped; tar cJf .device/bin.tar.xz -C .device bin.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-draw-faults.sh
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/sala-device-cache}
source eval/device-setup.sh
START=$(date +%s)
if [ -n "${TESTS:-}" ]; then
  (GOLDEN=0 JOBS=4 DEADLINE_S=${DEADLINE_S:-300} bash eval/device-tests.sh > "$OUT/tests.txt" 2>&1) &
  sleep 5
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
KERNELS=${KERNELS:-kernels kernels-new}
for k in $KERNELS; do
  timeout 120 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --log-file "$OUT/ncu-all-$k.csv" \
    $BIN/$k draw "1×73448 random logits, t 0.8 top-p" > "$OUT/all-$k.md" 2> "$OUT/all-$k.err"
  echo "== every kernel of a draw, $k (median µs, launches)"
  python3 - "$OUT/ncu-all-$k.csv" <<'PY'
import csv, collections, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
ki, vi = rows[h].index('Kernel Name'), rows[h].index('Metric Value')
by = collections.defaultdict(list)
for r in rows[h + 1:]:
    if len(r) > vi and r[vi]:
        by[r[ki].split('(')[0][:70]].append(float(r[vi].replace(',', '')) / 1e3)
for name, d in sorted(by.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1]))[:25]:
    print(f'  {statistics.median(d):8.1f} us  x{len(d):4d}  {name}')
PY
  grep -iE "self-check|failed|error" "$OUT/all-$k.err" | head -3
  xz -f "$OUT/ncu-all-$k.csv"
done
KERNELS=$(echo $KERNELS | awk '{print $NF}') ONLY=SALA bash eval/device-draw-profile.sh > /dev/null 2>&1
cat "$OUT"/draw-device-*.md
wait
[ -n "${TESTS:-}" ] && grep -E "^(PASS|FAIL|NOT RUN|TIMEOUT)" "$OUT/tests.txt"
for round in $(seq ${ROUNDS:-2}); do
  [ $(( $(date +%s) - START )) -lt ${ROUND_BY:-430} ] || break
  for bin in ${BINS:-sala sala-new}; do
    echo "== $bin, round $round" | tee -a "$OUT/bench.md"
    timeout 130 $BIN/$bin bench --synthetic minicpm-sala-9b --bits 4 -p 0 -n 128 -d 4096 -r 3 --n-seq 1 -o md --profile 2>>"$OUT/errors-$bin.log" \
      | grep -E "tg128|test " | tee -a "$OUT/bench.md"
  done
done
grep -ihE "self-check|draw" "$OUT"/errors-*.log | sort | uniq -c | head -5
rm -rf "$OUT/cache"
