// The batched draw (cuda/draw.cu) in the forms a decode step launches (src/kernels/draw.rs: a
// block of 1024 threads per row; bfloat16 logits, or float32 after penalties; with and without
// the grammar's mask), for eval/cuda_compile_check.py.
typedef unsigned int uint32_t;
#include <cuda_bf16.h>
#define INFINITY __int_as_float(0x7f800000)  // MLX's preamble defines it at run time
#include "cuda/draw.cu"

extern "C" __global__ void draw_bf16(const __nv_bfloat16* logits, const uint32_t* words, const uint32_t* params, uint32_t* token, int vocab, int width) {
  sala_draw<__nv_bfloat16, false, 1024>(logits, words, params, token, vocab, width);
}
extern "C" __global__ void draw_f32_mask(const float* logits, const uint32_t* words, const uint32_t* params, uint32_t* token, int vocab, int width) {
  sala_draw<float, true, 1024>(logits, words, params, token, vocab, width);
}
