// The general GEMV (cuda/qmv.cu) in the forms and default tilings a SALA-9B decode step launches
// at 4 and 8 bits in bf16 (src/kernels/qmv.rs, general_tiling), and its tensor-core core
// (cuda/qmv_rows_mma.cu); the tensor-core product of decode batches (cuda/qmv_mma.cu) at 16,
// 32 and 64 input rows; for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
#include "cuda/round.cu"
#include "cuda/mma.cu"
#include "cuda/unpack.cu"
#include "cuda/qmv_rows_mma.cu"
#include "cuda/qmv.cu"
#include "cuda/qmv_mma.cu"
using T = __nv_bfloat16;
constexpr int EPS = 0x358637bd;  // 1e-6
constexpr int HALF_ALPHA = 0x3f000000;

extern "C" __global__ void q4_gate_up(const T* x, const T* norm, const uint32_t* w, const T* s, const T* b, T* y, int F) {
  sala_qmv_swiglu_normed<T, 4, 64, 1, 8, 8, 1, 2, false, true, 4096, EPS>(x, norm, w, s, b, y, F);
}
extern "C" __global__ void q4_qkvz(const T* x, const T* norm, const uint32_t* w, const T* s, const T* b, T* y, int N) {
  sala_qmv_normed<T, 4, 64, 1, 8, 4, 1, 2, true, true, 4096, EPS>(x, norm, w, s, b, y, N);
}
extern "C" __global__ void q4_down(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int N, int K) {
  sala_qmv_residual<T, 4, 64, 1, 8, 2, 8, 2, false, false, HALF_ALPHA>(x, w, s, b, res, y, N, K);
}
extern "C" __global__ void q4_head(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int N, int K) {
  sala_qmv<T, 4, 64, 1, 8, 4, 1, 2, false, false>(x, w, s, b, y, N, K);
}
extern "C" __global__ void q4_o_proj_gated(const T* x, const T* norm, const T* g, int W, const uint32_t* w, const T* s, const T* b,
                                           const T* res, T* y, int N) {
  sala_qmv_residual_norm_gated<T, 4, 64, 1, 8, 2, 2, 2, false, false, HALF_ALPHA, 4096, EPS, 12288>(x, norm, g, W, w, s, b, res, y, N);
}
extern "C" __global__ void q8_gate_up(const T* x, const T* norm, const uint32_t* w, const T* s, const T* b, T* y, int F) {
  sala_qmv_swiglu_normed<T, 8, 64, 1, 8, 2, 1, 2, true, false, 4096, EPS>(x, norm, w, s, b, y, F);
}
extern "C" __global__ void q4_tensor_cores_gate_up(const T* x, const T* norm, const uint32_t* w, const T* s, const T* b, T* y, int F) {
  sala_qmv_swiglu_normed<T, 4, 64, 1, 8, 16, 8, 2, false, false, 4096, EPS>(x, norm, w, s, b, y, F);
}
extern "C" __global__ void q4_tensor_cores_down(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int N, int K) {
  sala_qmv_residual<T, 4, 64, 1, 8, 16, 8, 2, false, false, HALF_ALPHA>(x, w, s, b, res, y, N, K);
}
// sala_qmm<T, BITS, GROUP, HALVES, WARPS, NT, U, ASYNC, EPI, ALPHA_BITS>
extern "C" __global__ void q8_rows16_gate_up(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 2, 4, 2, 1, false, 2, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q8_rows16_down(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 2, 8, 2, 2, false, 1, HALF_ALPHA>(x, w, s, b, res, y, rows, N, K);
}
extern "C" __global__ void q8_rows16_head(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 2, 4, 4, 1, false, 0, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q4_rows16_gate_up(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 4, 64, 2, 4, 2, 2, false, 2, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q4_rows16_g32(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 4, 32, 2, 4, 2, 2, false, 0, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q8_down(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int N, int K) {
  sala_qmv_residual<T, 8, 64, 1, 8, 2, 2, 2, true, false, HALF_ALPHA>(x, w, s, b, res, y, N, K);
}
extern "C" __global__ void q8_rows16_gate_up_ring(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 2, 4, 2, 4, true, 2, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q8_rows16_down_ring(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 2, 8, 2, 3, true, 1, HALF_ALPHA>(x, w, s, b, res, y, rows, N, K);
}
extern "C" __global__ void q4_rows8_ring(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 4, 64, 1, 4, 2, 4, true, 0, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q8_rows64_gate_up(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 8, 4, 2, 2, false, 2, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q8_rows64_down(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 8, 8, 1, 2, false, 1, HALF_ALPHA>(x, w, s, b, res, y, rows, N, K);
}
extern "C" __global__ void q8_rows32_plain(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 4, 8, 2, 2, false, 0, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q4_rows64_gate_up(const T* x, const uint32_t* w, const T* s, const T* b, T* y, int rows, int N, int K) {
  sala_qmm<T, 4, 64, 8, 4, 2, 2, false, 2, 0>(x, w, s, b, nullptr, y, rows, N, K);
}
extern "C" __global__ void q8_rows64_ring(const T* x, const uint32_t* w, const T* s, const T* b, const T* res, T* y, int rows, int N, int K) {
  sala_qmm<T, 8, 64, 8, 8, 1, 3, true, 1, HALF_ALPHA>(x, w, s, b, res, y, rows, N, K);
}
