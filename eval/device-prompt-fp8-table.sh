#!/bin/bash
# Issue 60, the FP8 prompt products' loss and issue 60's table rows, exact and with --prompt-fp8,
# on one H200 in one call:
#   1. golden case C's 1500-token sparse prefill with FP8 prompt products against the reference
#      (tests/golden.rs c_sparse_prefill_in_fp8_prompt_products: the departure, printed;
#      GOLDEN_FP8=0 leaves it out);
#   2. the 1,048,576-token SALA-9B 8-bit prompt (eval/device-prefill-table.sh's config), with
#      --prompt-fp8, then exact (ONE_M=0 leaves both out, ONE_M_EXACT=0 the exact one);
#   3. `sala bench` prefill, exact then --prompt-fp8, for each of MODELS (default qwen3-8b; "" none) at
#      PROMPTS (default 4096,32768) and SALA-9B at SALA_PROMPTS (default 131072; "" none).
# Prepare as eval/device-prefill-select.sh says; carry [".device/bin.tar.xz", ".device/mlx-cuda",
# ".device/golden"] (and .device/kernel-cache.tar.xz if an earlier call sent one back).
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
trap - EXIT
if [ "${GOLDEN_FP8:-1}" = 1 ]; then
  SALA_TEST_DEVICE=gpu SALA_SHARED=.device MLX_ENABLE_TF32=0 timeout 200 $BIN/golden --exact c_sparse_prefill_in_fp8_prompt_products --nocapture \
    > "$OUT/golden-fp8.log" 2>&1
  phase "golden fp8 rc=$?"
  grep -E "products:|test result|panicked|skipped" "$OUT/golden-fp8.log"
fi
bench() { timeout "$1" $BIN/sala bench "${@:2}" -n 0 -d 0 -r 1 -o csv --output-file "$OUT/prefill.csv" 2>> "$OUT/bench.err"; phase "bench ${*:2} rc=$?"; }
if [ "${ONE_M:-1}" = 1 ]; then
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576; json.dump(c, open('/tmp/minicpm-sala-9b-1m.json', 'w'))"
  # The first sala process on a fresh machine compiles every kernel (130 s on an H200, 2026-12-04)
  # before its ~35 s of weights and its ~70 s prompt: 200 s was too short.
  bench 330 --synthetic /tmp/minicpm-sala-9b-1m.json --bits 8 -p 1048576 --prompt-fp8
  [ "${ONE_M_EXACT:-1}" = 1 ] && bench 200 --synthetic /tmp/minicpm-sala-9b-1m.json --bits 8 -p 1048576
fi
for model in ${MODELS-qwen3-8b}; do
  bench 150 --synthetic $model --bits 8 -p ${PROMPTS:-4096,32768}
  bench 150 --synthetic $model --bits 8 -p ${PROMPTS:-4096,32768} --prompt-fp8
done
if [ -n "${SALA_PROMPTS-131072}" ]; then
  bench 150 --synthetic minicpm-sala-9b --bits 8 -p ${SALA_PROMPTS:-131072}
  bench 150 --synthetic minicpm-sala-9b --bits 8 -p ${SALA_PROMPTS:-131072} --prompt-fp8
fi
python3 - "$OUT/prefill.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f'{r["model_filename"]} {r["dtype"]} pp{r["n_prompt"]}: {float(r["avg_ts"]):,.0f} tok/s, {int(r["avg_ns"]) / 1e9:.2f} s, peak {int(r["peak_mem"]) / 1e9:.2f} GB')
PY
