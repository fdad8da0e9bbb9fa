// Appended after a kernel's sources: the kernel MLX generates after them is compiled for three
// thread blocks of 128 threads an SM, so ptxas keeps it within 65536 / 384 = 170 registers
// (spilling if it must). NVRTC defines `__global__` as a macro, and MLX writes the kernel's
// `__global__` after the header, so the launch bounds reach it from here.
#undef __global__
#define __global__ __attribute__((global)) __launch_bounds__(128, 3)
