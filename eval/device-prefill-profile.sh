#!/bin/bash
# Issue 60: where a prompt's time goes beside the products. Every kernel of a 4K SALA-9B 8-bit
# prompt under Nsight Compute (each launch timed on the device), summed by name; then `sala bench`
# prefill of SALA-9B and Qwen3-8B 8-bit at 4K and 32K with 2048- and 4096-token prompt steps.
# Prepare here: a SALA_OPENBLAS=off build of sala in .device/bin, stripped;
# tar cJf .device/bin.tar.xz -C .device bin; carry [".device/bin.tar.xz", ".device/mlx-cuda"].
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/kc}
source eval/device-setup.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout ${PROFILE_SECONDS:-240} "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum \
  --log-file "$OUT/ncu-prompt.csv" $BIN/sala bench --synthetic minicpm-sala-9b --bits 8 -p ${PROFILE_PROMPT:-4096} \
  --prefill-step ${PROFILE_STEP:-2048} -n 0 -d 0 -r 1 > /dev/null 2>&1
phase "ncu prompt rc=$?"
python3 eval/ncu_step.py --all "$OUT/ncu-prompt.csv" > "$OUT/ncu-prompt.md"; head -45 "$OUT/ncu-prompt.md"
xz -f "$OUT/ncu-prompt.csv"
for model in minicpm-sala-9b qwen3-8b; do
  for step in 2048 4096; do
    echo "## $model 8-bit, --prefill-step $step" >> "$OUT/bench.md"
    timeout 240 $BIN/sala bench --synthetic $model --bits 8 -p 4096,32768 --prefill-step $step -n 0 -d 0 -r 1 \
      2>> "$OUT/bench.err" | tee -a "$OUT/bench.md"
    phase "bench $model $step rc=${PIPESTATUS[0]}"
  done
done
