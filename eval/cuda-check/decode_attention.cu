// The tensor-core attention kernels: the decode attention (cuda/decode_attention_mma.cu) in the
// forms a SALA-9B decode step launches (src/kernels/sparse.rs: the whole cache, and InfLLM-V2's
// selected blocks) and Qwen3-8B's group of 4 heads, and SALA-9B's prefill attention over an 8-bit
// cache (its walk over rows: block_sparse_prefill.cu), for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
typedef int int32_t;
typedef long long int64_t;
#define INT_MAX 2147483647
#define INFINITY __int_as_float(0x7f800000)  // MLX's preamble defines it at run time
#include "cuda/unpack.cu"
#include "cuda/mma.cu"
#include "cuda/attention_mma.cu"
#include "cuda/decode_attention_mma.cu"
using T = __nv_bfloat16;
constexpr int SCALE = 0x3db504f3;  // 128^-0.5

extern "C" __global__ void sala_dense(const T* q, const T* k, const T* v, const T* kr, const T* vr, int len, int settled, float* out, float* lse) {
  sala_decode_attention_mma<T, 128, 16, 64, SCALE>(q, 1, k, v, kr, vr, len, settled, 4096, 64, (const int32_t*)nullptr, 0, out, lse);
}
extern "C" __global__ void sala_sparse(const T* q, const T* k, const T* v, const T* kr, const T* vr, int len, int settled,
                                       const int32_t* blocks, float* out, float* lse) {
  sala_decode_attention_mma<T, 128, 16, 96, SCALE>(q, 1, k, v, kr, vr, len, settled, 1 << 20, 64, blocks, 96, out, lse);
}
extern "C" __global__ void qwen3_dense(const T* q, const T* k, const T* v, const T* kr, const T* vr, int len, int settled, float* out, float* lse) {
  sala_decode_attention_mma<T, 128, 4, 64, SCALE>(q, 1, k, v, kr, vr, len, settled, 4096, 64, (const int32_t*)nullptr, 0, out, lse);
}
#include "cuda/block_sparse_prefill.cu"
// With --kv-bits 8: the prefill and the general kernel (cuda/block_sparse_attention.cu, decode's
// default) over codes, groups of 64.
extern "C" __global__ void sala_prefill_q8(const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr,
                                           SalaKvScales<T> qsb, const int32_t* blocks, int first, int len, int settled, T* out, int tq,
                                           int nsel) {
  sala_block_sparse_attention_mma_q8<T, 128, 16, 64, SCALE, 4, 64>(q, k, v, kr, vr, qsb, blocks, first, len, settled, out, tq, 1 << 20, 64, nsel);
}
#include "cuda/block_sparse_attention.cu"
extern "C" __global__ void sala_attention(const T* q, const T* k, const T* v, const T* kr, const T* vr, const int32_t* blocks, int first,
                                          int len, int settled, float* out, float* lse, int nsel) {
  sala_block_sparse_attention<T, 128, 16, 64, 96, SCALE>(q, k, v, kr, vr, blocks, first, len, settled, out, lse, 1, 1 << 20, 64, nsel);
}
extern "C" __global__ void sala_attention_q8(const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr,
                                             SalaKvScales<T> qsb, const int32_t* blocks, int first, int len, int settled, float* out,
                                             float* lse, int nsel) {
  sala_block_sparse_attention_q8<T, 128, 16, 64, 96, SCALE, 64>(q, k, v, kr, vr, qsb, blocks, first, len, settled, out, lse, 1, 1 << 20, 64, nsel);
}
// The CUDA-core decode attention (cuda/decode_attention.cu): Qwen3-8B's group of 4 heads, plain and
// over an 8-bit cache (bf16 and float32 rows), and SALA-9B's 16 heads in blocks of 8 over one.
#include "cuda/decode_attention.cu"
extern "C" __global__ void qwen3_cuda_cores(const T* q, const T* k, const T* v, const T* kr, const T* vr, int len, int settled, float* out,
                                            float* lse) {
  sala_decode_attention_split<T, 128, 4, 4, 64, SCALE>(q, 1, k, v, kr, vr, len, settled, 131072, 256, out, lse);
}
extern "C" __global__ void qwen3_cuda_cores_q8(const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr,
                                               SalaKvScales<T> qsb, int len, int settled, float* out, float* lse) {
  sala_decode_attention_split_q8<T, 128, 4, 4, 64, SCALE, 64>(q, 1, k, v, kr, vr, qsb, len, settled, 131072, 256, out, lse);
}
extern "C" __global__ void f32_cuda_cores_q8(const float* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr,
                                             SalaKvScales<float> qsb, int len, int settled, float* out, float* lse) {
  sala_decode_attention_split_q8<float, 64, 4, 4, 64, SCALE, 32>(q, 1, k, v, kr, vr, qsb, len, settled, 4096, 256, out, lse);
}
extern "C" __global__ void sala_cuda_cores_q8(const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr,
                                              SalaKvScales<T> qsb, int len, int settled, float* out, float* lse) {
  sala_decode_attention_split_q8<T, 128, 16, 8, 64, SCALE, 64>(q, 1, k, v, kr, vr, qsb, len, settled, 8192, 256, out, lse);
}
