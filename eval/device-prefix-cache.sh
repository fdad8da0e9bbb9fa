#!/bin/bash
# Follow-up time to first token after a long prefix, synthetic MiniCPM-SALA-9B 8-bit on the lent
# GPU: cold (the whole prompt prefilled), warm (the prefix cache), and from a prompt cache file
# with its pages dropped from the page cache (disk) or not (disk-cached). Prepare here (repo root):
#   ../shared/tools/mlx-cuda-bundle                          # -> .device/mlx-cuda (ignored)
#   SALA_OPENBLAS=off cargo build --release
#   mkdir -p .device/bin && cp target/release/sala .device/bin/ && strip .device/bin/sala
# On the device (carry [".device"]), one call each (a 1M cold run takes two minutes, twice):
#   bash eval/device-prefix-cache.sh 128k;  bash eval/device-prefix-cache.sh 1m;  bash eval/device-prefix-cache.sh 1m-past
# A prefix ends on a restart point (a multiple of 2048 tokens), or 2047 tokens past one ("past"):
# the most a first follow-up re-runs.
set -u
source .device/mlx-cuda/activate.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
DIR=$(mktemp -d -p "$PWD" prefix-cache.XXXX)
df -h "$DIR" | tee -a "$OUT/device.txt"
bench() {
  ./.device/bin/sala bench --suite prefix-cache --bits 8 -p 64 --cache-dir "$DIR" \
    -o csv --output-file "$OUT/prefix-cache-$1.csv" "${@:2}"
}
# The released config's context is 524288; the 1M runs lift it past 1M and the follow-up.
sala_1m() {
  python3 -c "import json; c = json.load(open('eval/synthetic/minicpm-sala-9b.json')); c['max_position_embeddings'] = 1048576 + 8192; json.dump(c, open('$DIR/minicpm-sala-9b-1m.json', 'w'))"
  echo "$DIR/minicpm-sala-9b-1m.json"
}
case "${1:-128k}" in
  128k) bench 128k --synthetic minicpm-sala-9b -d 131072,133119 -r 3 ;;
  1m) bench 1m --synthetic "$(sala_1m)" -d 1048576 -r 1 ;;
  1m-past) bench 1m-past --synthetic "$(sala_1m)" -d 1050623 -r 1 ;;
esac
rm -rf "$DIR"
