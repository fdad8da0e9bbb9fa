#!/bin/bash
# --kv-bits 8 on the lent GPU: golden A's greedy tokens with and without it (f32 with TF32 off,
# bf16; and on the host's CPU, where tests/kv_quant.rs runs), then the synthetic 9B's prefill and
# decode with and without it (speed and peak memory). The sparse layers' attention kernels read the
# codes in place; the dense decode attention (SALA below dense_len, the dense families) still reads
# the rows dequantized for each step.
# Prepare as eval/device-tests.sh says (sala and gpu_kernels in .device/bin.tar.xz; .device/mlx-cuda;
# .device/golden). On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda", ".device/golden"];
# bash eval/device-kv-bits.sh (TESTS="…" runs those GPU tests first, GOLDEN=0 skips golden A, LONG=1
# as below).
set -u
source eval/device-setup.sh
export MLX_ENABLE_TF32=0
if [ "${TESTS:-0}" != 0 ]; then
  # The GPU tests named in TESTS (e.g. "every_kernel 8_bit_cache"), before the benches.
  $BIN/gpu_kernels --include-ignored --test-threads=1 --nocapture $TESTS 2>&1 | tee "$OUT/gpu_kernels.log" \
    | grep -E "^test |test result|panicked|relative error|runs agree"
fi
if [ "${GOLDEN:-1}" = 1 ]; then
  A=.device/golden/A_dense_f32
  run() { $BIN/sala run --model $A --input-ids 1,2,3,4,5,6,7,8 --max-tokens 16 --temperature 0 --ignore-eos --json "$@" 2>&1 | head -1; }
  for dev in "gpu f32" "gpu bf16" "cpu f32"; do
    set -- $dev
    echo "golden A $1 $2 plain:   $(run --device $1 --dtype $2)"
    echo "golden A $1 $2 kv-bits: $(run --device $1 --dtype $2 --kv-bits 8)"
  done
fi
# The synthetic 9B, --kv-bits 8 then plain KV: by default prefill and decode at 4K; LONG=1: prefill
# of 32K tokens and decode after DEPTHS (default 4K and 1M; a copy of its config allowing 1M + 8K
# positions), where the sparse layers read the 8-bit cache's codes in place. Each table goes to
# $OUT/kv-bits.txt as it comes; a step that would run past DEADLINE_S (default 560) is stopped.
# MODES (default "kv8 plain") picks the caches and their order.
END_AT=$(( $(date +%s) + ${DEADLINE_S:-560} ))
left() { echo $(( END_AT - $(date +%s) > 1 ? END_AT - $(date +%s) : 1 )); }
python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576 + 8192; json.dump(c, open('$OUT/minicpm-sala-9b-1m.json', 'w'))"
for mode in ${MODES:-kv8 plain}; do
  kv=$([ "$mode" = kv8 ] && echo "--kv-bits 8")
  echo "== minicpm-sala-9b q8 ${kv:-plain KV}" | tee -a "$OUT/kv-bits.txt"
  if [ "${LONG:-0}" = 1 ]; then
    timeout "$(left)" $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 $kv -p 32768 -n 0 -d 0 -r 1 2>&1 | tail -1 | tee -a "$OUT/kv-bits.txt"
    timeout "$(left)" $BIN/sala bench --synthetic "$OUT/minicpm-sala-9b-1m.json" --bits 8 $kv -p 0 -n 64 -d ${DEPTHS:-4096,1048576} \
      -r 1 2>&1 | grep -v "^appended" | grep "tg64" | tee -a "$OUT/kv-bits.txt"
  else
    timeout "$(left)" $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 $kv -p 4096 -n 32 -d 0 -r 1 2>&1 | tail -2 | tee -a "$OUT/kv-bits.txt"
  fi
done
