#!/bin/bash
# Issue 60, one call on a lent GPU for branch private-walk (the prefill attention's own streams):
#   1. the GPU tests of the prefill attention and the block selection (eval/device-tests.sh,
#      TEST_SECONDS, default 300) against their MLX-ops oracles, and every kernel's self-check;
#   2. `sala bench` prefill of synthetic MiniCPM-SALA-9B 8-bit at 4K, 32K and 128K, and the base
#      binary (sala-base, carried beside) at 32K with the same 8192-token steps;
#   3. the 1,048,576-token prompt with what time is left of the call (ONE_M=0 leaves it out).
# Prepare here: SALA_OPENBLAS=off builds of sala and the gpu_kernels test binary in .device/bin
# (and sala-base, the binary to compare with), stripped; tar cf - -C .device bin | xz -6 > .device/bin.tar.xz;
# ../shared/tools/mlx-cuda-bundle .device/mlx-cuda.
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-private-walk.sh
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
END_AT=$(( $(date +%s) + ${CALL_SECONDS:-585} ))
GOLDEN=0 TESTS=${TESTS:-'block_sparse_attention|block_selection_kernel_matches|top_k_through|many_queries_top_k|every_kernel_passes'} \
  DEADLINE_S=${TEST_SECONDS:-300} JOBS=${JOBS:-5} bash eval/device-tests.sh
TESTS_RC=$?
rm -f "$OUT/kernel-cache.tar.xz"  # the tests' cache: too large to come back, and not needed
source eval/device-setup.sh
trap - EXIT
phase "tests rc=$TESTS_RC"
bench() {
  local binary=$1 limit=$2; shift 2
  local left=$(( END_AT - $(date +%s) ))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -gt 10 ] || { phase "skipped $binary $* (no time left)"; return; }
  timeout "$limit" $BIN/$binary bench "$@" -n 0 -d 0 -r 1 --prefill-step 8192 -o csv --output-file "$OUT/$binary.csv" 2>> "$OUT/bench.err" > /dev/null
  phase "$binary $* rc=$?"
}
bench sala 100 --synthetic minicpm-sala-9b --bits 8 -p 4096,32768,131072
bench sala-base 70 --synthetic minicpm-sala-9b --bits 8 -p 32768
# The 1M prompt takes two passes (a warm-up, then the timed one) of about a minute each on an H100.
if [ "${ONE_M:-1}" = 1 ] && [ $(( END_AT - $(date +%s) )) -ge 170 ]; then
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('/tmp/minicpm-sala-9b-1m.json', 'w'))"
  bench sala 300 --synthetic /tmp/minicpm-sala-9b-1m.json --bits 8 -p 1048576
fi
for csv in "$OUT"/sala*.csv; do
  [ -f "$csv" ] && python3 - "$csv" <<'EOF'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f'{sys.argv[1].rsplit("/", 1)[-1]} {r["model_filename"]} pp{r["n_prompt"]}: {float(r["avg_ts"]):,.0f} tok/s, {int(r["avg_ns"]) / 1e9:.2f} s, peak {int(r["peak_mem"]) / 1e9:.2f} GB')
EOF
done
tail -3 "$OUT/bench.err" 2>/dev/null
exit $TESTS_RC
