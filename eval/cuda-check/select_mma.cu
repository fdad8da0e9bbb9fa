// The block selection's tensor-core stage 1 (cuda/select_mma.cu) with its sources in the order
// SELECT_MMA_HEADER (src/kernels/sparse.rs) joins them, in SALA-9B's forms (16 query heads a KV
// head, level-2 windows of 128 every 64, level-1 of 32 every 16), with mma.sync and on Hopper with
// wgmma, for eval/cuda_compile_check.py.
#include "eval/cuda-check/preamble.h"
#include "cuda/unpack.cu"
#include "cuda/select_blocks.cu"
#include "cuda/mma.cu"
#include "cuda/attention_mma.cu"
#include "cuda/block_sparse_prefill.cu"
#include "cuda/wgmma.cu"
#include "cuda/select_mma.cu"
constexpr int SCALE = 0x3db504f3;  // 128^-0.5

extern "C" __global__ void lse(const __nv_bfloat16* q, const __nv_bfloat16* c2, int first, float* partial, int tq, int n2) {
  sala_select_lse_mma<__nv_bfloat16, 128, 16, 128, 64, SCALE, 8, false>(q, c2, first, partial, tq, n2);
}
extern "C" __global__ void lse_f32(const __nv_bfloat16* q, const float* c2, int first, float* partial, int tq, int n2) {
  sala_select_lse_mma<float, 128, 16, 128, 64, SCALE, 8, false>(q, c2, first, partial, tq, n2);
}
extern "C" __global__ void windows(const __nv_bfloat16* q, const __nv_bfloat16* c1, const float* partial, int first, __nv_bfloat16* m,
                                   int tq, int n1, int ranges) {
  sala_select_windows_mma<__nv_bfloat16, __nv_bfloat16, 128, 16, 32, 16, 64, SCALE, 8>(q, c1, partial, first, m, tq, n1, ranges);
}
extern "C" __global__ void lse_wgmma(const __nv_bfloat16* q, const __nv_bfloat16* c2, int first, float* partial, int tq, int n2) {
  sala_select_lse_mma<__nv_bfloat16, 128, 16, 128, 64, SCALE, 8, true>(q, c2, first, partial, tq, n2);
}
extern "C" __global__ void windows_wgmma(const __nv_bfloat16* q, const __nv_bfloat16* c1, const float* partial, int first, __nv_bfloat16* m,
                                         int tq, int n1, int ranges) {
  sala_select_windows_wgmma<__nv_bfloat16, 128, 16, 32, 16, 64, SCALE>(q, c1, partial, first, m, tq, n1, ranges);
}
// The self-check's d = 64 form.
extern "C" __global__ void windows_wgmma_d64(const __nv_bfloat16* q, const __nv_bfloat16* c1, const float* partial, int first, __nv_bfloat16* m,
                                             int tq, int n1, int ranges) {
  sala_select_windows_wgmma<__nv_bfloat16, 64, 2, 32, 16, 64, SCALE>(q, c1, partial, first, m, tq, n1, ranges);
}
