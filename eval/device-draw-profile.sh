#!/bin/bash
# Issue 58: what the draw kernel (cuda/draw.cu) costs a decode step. `kernels draw` times it
# against its MLX-ops version on SALA's and Qwen3's vocabularies (one row and 16; greedy is the
# argmax and not drawn here), host-timed medians, then once more under Nsight Compute with only
# the draw's launches profiled (their device durations, eval/draw_profile.py). KERNELS names the
# benchmark binaries in .device/bin to run, one after another (default: kernels); ONLY, the cases
# whose name holds it (e.g. SALA).
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-draw-profile.sh
set -u
source eval/device-setup.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for k in ${KERNELS:-kernels}; do
  timeout 100 $BIN/$k draw ${ONLY:-} 2>&1 | tee "$OUT/draw-host-timed-$k.md"
  timeout 150 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv --kernel-name regex:draw \
    --log-file "$OUT/ncu-draw-$k.csv" $BIN/$k draw ${ONLY:-} > "$OUT/draw-under-ncu-$k.md" 2> "$OUT/draw-under-ncu-$k.err"
  python3 eval/draw_profile.py "$OUT/draw-under-ncu-$k.md" "$OUT/ncu-draw-$k.csv" | tee "$OUT/draw-device-$k.md"
  xz -f "$OUT/ncu-draw-$k.csv"
done
rm -rf "$OUT/cache"
