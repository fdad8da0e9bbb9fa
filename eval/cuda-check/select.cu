// The block selection's pooling and top-k (cuda/select_blocks.cu) in the forms a SALA-9B step
// launches (src/kernels/sparse.rs: one thread block per query and KV head, 1024 candidates, and at
// long-context decode the chunked form and its merge), for eval/cuda_compile_check.py.
typedef int int32_t;
#define INFINITY __int_as_float(0x7f800000)  // MLX's preamble defines it at run time
#include <cuda_bf16.h>
#include "cuda/select_blocks.cu"

extern "C" __global__ void topk(const float* ws, int first_pos, int nb, int32_t* blocks, float* scores, int n1) {
  sala_select_topk<32, 16, 64, 1, 32, 96, 1024, false>(ws, first_pos, nb, blocks, scores, n1);
}
extern "C" __global__ void topk_chunk(const float* ws, int first_pos, int nb, unsigned long long* cand, float* scores, int n1) {
  sala_select_topk_chunk<32, 16, 64, 1, 32, 96, 512, 2, false>(ws, first_pos, nb, cand, scores, n1);
}
// From the tensor-core stage 1's window maxima (bf16 scores, the model's).
extern "C" __global__ void topk_maxima(const __nv_bfloat16* m, int first_pos, int nb, int32_t* blocks, float* scores, int len) {
  sala_select_topk<32, 16, 64, 1, 32, 96, 1024, true>(m, first_pos, nb, blocks, scores, len);
}
extern "C" __global__ void topk_chunk_maxima(const __nv_bfloat16* m, int first_pos, int nb, unsigned long long* cand, float* scores, int len) {
  sala_select_topk_chunk<32, 16, 64, 1, 32, 96, 512, 2, true>(m, first_pos, nb, cand, scores, len);
}
extern "C" __global__ void topk_merge(const unsigned long long* cand, int first_pos, int nb, int32_t* blocks, int n) {
  sala_select_topk_merge<64, 96, 4>(cand, first_pos, nb, blocks, n);
}
