#!/bin/bash
# Issue 34: what bounds SALA-9B's decode step at 4K, one GPU, one call. Per bit width: the
# host/device split of a step (`kernels decode-step`: build, encode, wait, and the threaded path
# `sala bench` runs), `sala bench` tg64, then for 4 bits the host's threads under a sampling
# profiler (`kernels host-profile`, the threaded path) and every kernel of one step under Nsight
# Compute (`kernels decode-profile`, summed by eval/ncu_step.py). Nsight Systems, when the machine
# has it, times the gaps between kernels of pipelined steps.
# Prepare here (repo root): SALA_OPENBLAS=off cargo build --release && SALA_OPENBLAS=off cargo bench
#   --bench kernels --no-run; copy sala and the bench (as kernels) to .device/bin; strip sala,
#   `strip --strip-debug` kernels; tar cJf .device/bin.tar.xz -C .device bin
# On the device: carry [".device/bin.tar.xz", ".device/mlx-cuda"]; bash eval/device-sala-decode.sh
set -u
source eval/device-setup.sh
nproc; grep -m1 "model name" /proc/cpuinfo
export SALA_KERNELS_MODEL=${MODEL:-minicpm-sala-9b}
for bits in ${BITS:-4 8}; do
  echo "== $SALA_KERNELS_MODEL q$bits"
  $BIN/sala bench --synthetic "$SALA_KERNELS_MODEL" --bits "$bits" -p 0 -n 64 -d 4096 -r 3 -o csv 2>/dev/null | tail -1
  SALA_KERNELS_BITS=$bits $BIN/kernels decode-step 4096 2>&1 | grep "^|" | tee "$OUT/decode-step-q$bits.md"
done
SALA_KERNELS_BITS=4 $BIN/kernels host-profile 4096 > "$OUT/host-profile-q4.md" 2>&1
head -40 "$OUT/host-profile-q4.md"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  for bits in ${NCU_BITS:-4}; do
    SALA_KERNELS_BITS=$bits timeout 240 "$NCU" --metrics gpu__time_duration.sum --clock-control none --csv \
      --profile-from-start off --log-file "$OUT/ncu-q$bits.csv" $BIN/kernels decode-profile 4096 > /dev/null 2>&1
    python3 eval/ncu_step.py "$OUT/ncu-q$bits.csv" | tee "$OUT/ncu-q$bits.txt" | head -40
    xz -f "$OUT/ncu-q$bits.csv"
  done
fi
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
