// Appended after a kernel's sources, once SALA_LAUNCH_THREADS and SALA_LAUNCH_BLOCKS are defined:
// the kernel MLX generates after them is compiled for SALA_LAUNCH_BLOCKS thread blocks of
// SALA_LAUNCH_THREADS threads an SM, so ptxas keeps it within 65536 / (blocks · threads)
// registers (spilling if it must). NVRTC defines `__global__` as a macro, and MLX writes the
// kernel's `__global__` after the header, so the launch bounds reach it from here.
#undef __global__
#define __global__ __attribute__((global)) __launch_bounds__(SALA_LAUNCH_THREADS, SALA_LAUNCH_BLOCKS)
