// The prefill attention's walk over a cache of rows (cuda/block_sparse_prefill.cu) in SALA-9B's
// form (16 query heads a KV head, heads of 128, 4 queries a thread block, 96 of at most 128 blocks,
// two ring stages, three thread blocks an SM), as src/kernels/sparse.rs launches it, for
// eval/cuda_compile_check.py.
#include "eval/cuda-check/preamble.h"
#include "cuda/unpack.cu"
#include "cuda/mma.cu"
#include "cuda/attention_mma.cu"
#include "cuda/block_sparse_prefill.cu"
constexpr int SCALE = 0x3db504f3;  // 128^-0.5

typedef __nv_bfloat16 bf16;
extern "C" __global__ void __launch_bounds__(128, 3) ring(const bf16* q, const bf16* k, const bf16* v, const bf16* kr, const bf16* vr,
                                                           const int32_t* blocks, int first, int kv_len, int settled, bf16* out, int tq,
                                                           int cap, int rcap, int nsel) {
  sala_block_sparse_attention_mma<bf16, 128, 16, 64, SCALE, 4, 128, 2, true>(q, k, v, kr, vr, blocks, first, kv_len, settled, out, tq, cap, rcap, nsel);
}
// The earlier form (every block through the shared walk), which the kernels bench times beside it.
extern "C" __global__ void __launch_bounds__(128, 3) union_walk(const bf16* q, const bf16* k, const bf16* v, const bf16* kr, const bf16* vr,
                                                                 const int32_t* blocks, int first, int kv_len, int settled, bf16* out,
                                                                 int tq, int cap, int rcap, int nsel) {
  sala_block_sparse_attention_mma<bf16, 128, 16, 64, SCALE, 4, 128, 2, false>(q, k, v, kr, vr, blocks, first, kv_len, settled, out, tq, cap, rcap, nsel);
}
