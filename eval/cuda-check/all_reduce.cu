// The tensor-parallel sum through peer memory (cuda/all_reduce.cu) as src/kernels/all_reduce.rs
// launches it: bf16, f16 and float32, 2 to 8 ranks, the 16 MiB region of two ranks and the 1 MiB one; for
// eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
#include "cuda/all_reduce.cu"

extern "C" __global__ void sum_bf16_two(const __nv_bfloat16* x, const unsigned long long* table, __nv_bfloat16* y, uint32_t* ticket, size_t n) {
  sala_all_sum<__nv_bfloat16, 2, 1, 4202496, 16777216, false>(x, table, y, ticket, n);
}
extern "C" __global__ void sum_f32_four(const float* x, const unsigned long long* table, float* y, uint32_t* ticket, size_t n) {
  sala_all_sum<float, 4, 0, 0, 1048576, false>(x, table, y, ticket, n);
}
extern "C" __global__ void sum_f16_eight(const __half* x, const unsigned long long* table, __half* y, uint32_t* ticket, size_t n) {
  sala_all_sum<__half, 8, 7, 0, 1048576, true>(x, table, y, ticket, n);
}
