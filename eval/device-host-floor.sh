#!/bin/bash
# Issue 58: the host's floor under a decode step, on one lent GPU. Each preset is also run narrowed
# to hidden size 1024 (same layers, same kinds of layer, same vocabulary, so the same kernels and
# the same number of operations in a step), whose ~0.8 GB at 8 bits the GPU reads in about 0.2 ms.
# Its step time is then what the host costs (building, encoding, reading back); the released
# model's step at 8 and 4 bits shows how far above that floor the weights' bytes put it.
# Pipelined and served rows, 1 and 16 streams, with `--profile`.
# Prepare as eval/device-draw.sh (BINS: binaries in .device/bin.tar.xz, default `sala`).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-host-floor.sh
#   MODELS (presets), BINS, BITS ("8 4" for the released shapes), N (tokens, 128), R (repetitions, 2)
#   pick what runs; results in $OUT/results.md.
set -u
source eval/device-setup.sh
N=${N:-128}
for preset in ${MODELS:-minicpm-sala-9b qwen3-8b}; do
  narrow=/tmp/host-floor/$preset-narrow/config.json
  mkdir -p "$(dirname "$narrow")"
  python3 - "eval/synthetic/$preset.json" "$narrow" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
heads = 1024 // c.get("head_dim", 128)
c.update(hidden_size=1024, intermediate_size=2048, num_attention_heads=heads,
         num_key_value_heads=min(c["num_key_value_heads"], heads))
for key in ("lightning_nh", "lightning_nkv"):
    if key in c:
        c[key] = 1024 // c.get("lightning_head_dim", 128)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
  for bin in ${BINS:-sala}; do
    for model in "$narrow:8" $(for b in ${BITS:-8 4}; do echo "$preset:$b"; done); do
      echo "== $bin ${model%:*} ${model##*:}-bit" | tee -a "$OUT/results.md"
      timeout 200 $BIN/$bin bench --synthetic "${model%:*}" --bits "${model##*:}" -p 0 -n $N -r ${R:-2} --n-seq 1,16 --profile -o md \
        2>>"$OUT/errors.log" | grep "tg" | tee -a "$OUT/results.md"
    done
  done
done
