# Sourced by the device scripts: unpacks the binaries carried in .device/bin.tar.xz into
# .device/bin ($BIN), puts the carried MLX CUDA runtime on the path (MLX_BUNDLE, default
# .device/mlx-cuda; eval/device-compare.sh's --with-python bundle serves as well), keeps the
# kernels' self-check memo under $OUT, records the GPU and the host CPU in $OUT/device.txt, and
# defines `phase` (a step's end, timed, into $OUT/phases.txt).
# Once a tarball (by its checksum, not its time: a warm machine keeps .device/bin between calls
# and its clock is not this one's): a script sourcing this beside another leaves the running
# binaries alone.
TARBALL_SUM=$(md5sum < .device/bin.tar.xz)
if [ "$(cat .device/bin/.unpacked 2>/dev/null)" != "$TARBALL_SUM" ]; then
  tar xJf .device/bin.tar.xz -C .device && echo "$TARBALL_SUM" > .device/bin/.unpacked
fi
BIN=.device/bin
source "${MLX_BUNDLE:-.device/mlx-cuda}/activate.sh"
OUT=${OUT:-/tmp}
phase() { echo "$(date +%s) +${SECONDS}s $*" | tee -a "$OUT/phases.txt"; }
# DEVICE_CACHE keeps compiled kernels and self-check memos for a later call on a warm machine.
export XDG_CACHE_HOME=${DEVICE_CACHE:-$OUT/cache}
# MLX's PTX and the driver's SASS of them there too, so they can travel: a fresh machine compiles
# every kernel variant once (a cold gpu_kernels run spent about two of its four minutes on it).
export MLX_PTX_CACHE_DIR=$XDG_CACHE_HOME/mlx-ptx CUDA_CACHE_PATH=$XDG_CACHE_HOME/nv
# .device/kernel-cache.tar.xz, carried, is a cache an earlier call sent back in $OUT: entries are
# named by their source's hash and self-check memos by the binary's, so stale ones are never used.
[ -f .device/kernel-cache.tar.xz ] && mkdir -p "$XDG_CACHE_HOME" && tar xJf .device/kernel-cache.tar.xz -C "$XDG_CACHE_HOME"
keep_kernel_cache() { tar cf - -C "$XDG_CACHE_HOME" . 2>/dev/null | xz -T0 -3 > "$OUT/kernel-cache.tar.xz"; }
# At exit, unless the script sets its own EXIT trap (then it may call keep_kernel_cache itself).
trap keep_kernel_cache EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
# The host's CPU too: a decode step at one sequence is bound by the host, and leases differ in it.
{ grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'; nproc; nvidia-smi --query-gpu=uuid --format=csv,noheader; } | tee -a "$OUT/device.txt"
