// The FP8 prompt product (cuda/fp8_gemm.cu) and its roundings of x and of MLX's 8- and 4-bit
// matrices, for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
typedef unsigned char uint8_t;
typedef unsigned long long uint64_t;
#include "cuda/mma.cu"
#include "cuda/wgmma.cu"
#include "cuda/fp8_gemm.cu"
using T = __nv_bfloat16;

extern "C" __global__ void rows_bf16(const T* x, int R, int K, uint8_t* q, float* s) { sala_rows_to_e4m3<T, 0>(x, R, K, q, s); }
extern "C" __global__ void rows_f32_tiles(const float* x, int R, int K, uint8_t* q, float* s) { sala_rows_to_e4m3<float, 128>(x, R, K, q, s); }
extern "C" __global__ void q8_64_tiles(const uint32_t* p, const T* s, const T* b, int N, int K, uint8_t* wq, float* ws) {
  sala_quantized_to_e4m3<T, 64, 8, 256>(p, s, b, N, K, wq, ws);
}
extern "C" __global__ void q4_32(const uint32_t* p, const T* s, const T* b, int N, int K, uint8_t* wq, float* ws) {
  sala_quantized_to_e4m3<T, 32, 4, 0>(p, s, b, N, K, wq, ws);
}
extern "C" __global__ void gemm_bulk_256_4(const uint8_t* xq, const float* xs, const uint8_t* wq, const float* ws, int M, int N, int K, T* y) {
  sala_gemm_e4m3_bulk<T, 256, 4>(xq, xs, wq, ws, M, N, K, y);
}
extern "C" __global__ void gemm_256_4(const uint8_t* xq, const float* xs, const uint8_t* wq, const float* ws, int M, int N, int K, T* y) {
  sala_gemm_e4m3<T, 256, 4>(xq, xs, wq, ws, M, N, K, y);
}
