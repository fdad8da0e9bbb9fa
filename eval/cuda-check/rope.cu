// The dense families' decode step before attention and a prompt chunk's heads (cuda/rope.cu) in
// bf16 for 128-wide heads with QK-norm, as src/kernels/rope.rs launches them (SALA's lightning
// layers: 32 heads, no KV grouping; Qwen3-8B: 32 query and 8 KV heads); for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef int int32_t;
typedef long long int64_t;
#include "cuda/round.cu"
#include "cuda/rope.cu"
using T = __nv_bfloat16;
constexpr int EPS = 0x358637bd;  // 1e-6
constexpr int ONE = 0x3f800000;
constexpr int LOG2_BASE = 0x41a4d169;  // log2(1e6)

extern "C" __global__ void prompt_lightning(const T* rows, long long bs, long long ts, long long col, const T* qn, const T* kn,
                                            const float* periods, const int32_t* positions, int npos, int tokens, T* q, T* k, T* v) {
  sala_rope_prompt<T, 128, 128, 32, 32, true, false, EPS, ONE, ONE, LOG2_BASE>(rows, bs, ts, col, qn, kn, periods, positions, npos, tokens, q, k, v);
}
extern "C" __global__ void prompt_qwen3(const T* rows, long long bs, long long ts, long long col, const T* qn, const T* kn,
                                        const float* periods, const int32_t* positions, int npos, int tokens, T* q, T* k, T* v) {
  sala_rope_prompt<T, 128, 128, 32, 8, true, false, EPS, ONE, ONE, LOG2_BASE>(rows, bs, ts, col, qn, kn, periods, positions, npos, tokens, q, k, v);
}
extern "C" __global__ void decode_qwen3(const T* row, long long col, const T* qn, const T* kn, const float* periods, int position,
                                        const T* kr, const T* vr, int rcap, int at, T* q, T* k, T* v) {
  sala_rope_append<T, 128, 128, 32, 8, true, false, EPS, ONE, ONE, LOG2_BASE>(row, col, qn, kn, periods, position, kr, vr, rcap, at, q, k, v);
}
