// The int8 prompt product (cuda/qmm_i8.cu) at MLX's three group sizes, and its quantizing of x,
// for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
typedef int int32_t;
typedef signed char int8_t;
#include "cuda/mma.cu"
#include "cuda/qmm_i8.cu"
using T = __nv_bfloat16;

extern "C" __global__ void quantize64(const T* x, size_t total, int8_t* xq, float* xs, T* hi, T* lo) {
  sala_quantize_rows_i8<T, 64>(x, total, xq, xs, hi, lo);
}
extern "C" __global__ void qmm64(const int8_t* xq, const float* xs, const T* hi, const T* lo, const uint32_t* w, const T* s, const T* b,
                                 int M, int N, int K, T* y) {
  sala_qmm_i8<T, 64>(xq, xs, hi, lo, w, s, b, M, N, K, y);
}
extern "C" __global__ void qmm32(const int8_t* xq, const float* xs, const T* hi, const T* lo, const uint32_t* w, const T* s, const T* b,
                                 int M, int N, int K, T* y) {
  sala_qmm_i8<T, 32>(xq, xs, hi, lo, w, s, b, M, N, K, y);
}
extern "C" __global__ void qmm128_f16(const int8_t* xq, const float* xs, const __half* hi, const __half* lo, const uint32_t* w,
                                      const __half* s, const __half* b, int M, int N, int K, __half* y) {
  sala_qmm_i8<__half, 128>(xq, xs, hi, lo, w, s, b, M, N, K, y);
}
