#!/bin/bash
# Issue 58: where a 4-bit decode step's quantized products lose time, one call on one lent GPU.
#  0. Beside each other (nothing here is timed): the GPU tests named by TESTS (a grep -E pattern,
#     none by default; eval/device-tests.sh with GOLDEN=0 and DEADLINE_S) and, with WARM=1, one
#     short served bench per width in BITS, which compiles the draw's kernels and their
#     self-checks into DEVICE_CACHE for eval/device-decode-bound.sh in the next call on the same
#     warm machine.
#  1. Then Nsight Compute's sections (occupancy, warp stalls, scheduler, memory) on the quantized
#     products of one SALA-9B decode step at 4096 tokens (the first NCU_COUNT launches: a
#     lightning and a sparse layer's products), each width in BITS_NCU ("4"), SEQS sequences a
#     step (1; 16 takes the tensor-core batch products, sala_qmm).
# Prepare: as eval/device-decode-bound.sh. Carry [".device/bin.tar.xz", ".device/mlx-cuda"].
set -u
export DEVICE_CACHE=${DEVICE_CACHE:-/tmp/sala-device-cache}
source eval/device-setup.sh
if [ "${WARM:-1}" = 1 ]; then
  (for bits in ${BITS:-4 8}; do
      timeout 200 $BIN/sala bench --synthetic minicpm-sala-9b --bits $bits -p 0 -n 8 -d 4096 -r 1 --profile -o md 2>>"$OUT/errors.log" | grep -E "tg8" | tee -a "$OUT/warm.md"
    done) &
fi
if [ -n "${TESTS:-}" ]; then
  GOLDEN=0 bash eval/device-tests.sh > "$OUT/tests.txt" 2>&1
  tail -n 30 "$OUT/tests.txt"
fi
wait
cat "$OUT/warm.md" 2>/dev/null
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for bits in ${BITS_NCU:-4}; do
  SALA_KERNELS_BITS=$bits timeout 240 "$NCU" --clock-control none --profile-from-start off \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio \
    -k regex:sala_qm -c "${NCU_COUNT:-10}" "$BIN/kernels" decode-profile 4096 "${SEQS:-1}" > "$OUT/ncu-q$bits.txt" 2>&1
  python3 - "$OUT/ncu-q$bits.txt" <<'PY'
import re, sys
# One line a launch: the kernel, its duration, occupancy, registers and the top stall reasons.
name = None
for line in open(sys.argv[1]):
    m = re.match(r'\s+(custom_kernel_\S+?)\(', line)
    if m: name = m.group(1)[len('custom_kernel_'):][:60]; print('==', name)
    for key in ('Duration', 'Achieved Occupancy', 'Theoretical Occupancy', 'Registers Per Thread', 'Block Limit Registers',
                'Memory Throughput', 'Issue Slots Busy', 'Eligible Warps Per Scheduler', 'No Eligible', 'Warp Cycles Per Issued Instruction',
                'Executed Ipc Active', 'DRAM Throughput', 'L1/TEX Hit Rate', 'L2 Hit Rate', 'Waves Per SM'):
        if line.strip().startswith(key): print('  ', ' '.join(line.split()))
    if 'issue_stalled' in line: print('  ', ' '.join(line.split()).replace('smsp__average_warps_issue_stalled_', '').replace('_per_issue_active.ratio', ''))
PY
done
