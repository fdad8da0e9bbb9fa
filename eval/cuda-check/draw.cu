// The draw (cuda/draw.cu) in the forms a decode step launches (src/kernels/draw.rs: the keys, then
// blocks of 256 threads a slice, 1024 a row for the thresholds; bfloat16 logits, or float32 after penalties;
// with and without the grammar's mask), for eval/cuda_compile_check.py.
typedef unsigned int uint32_t;
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define INFINITY __int_as_float(0x7f800000)  // MLX's preamble defines it at run time
#include "cuda/draw.cu"
using B = __nv_bfloat16;

extern "C" __global__ void keys(const uint32_t* params, uint32_t* keys, int rows, unsigned int advance) {
  sala_draw_keys(params, keys, rows, advance);
}
extern "C" __global__ void scan_bf16(const B* logits, const uint32_t* words, const uint32_t* params, float* part_v, int* part_i, int vocab,
                                     int width) {
  sala_draw_scan<B, false, 256>(logits, words, params, part_v, part_i, vocab, width);
}
extern "C" __global__ void bins_bf16(const B* logits, const uint32_t* words, const uint32_t* params, const float* part_v,
                                     const int* part_i, uint32_t* hist, int vocab, int width) {
  sala_draw_bins<B, false, 256>(logits, words, params, part_v, part_i, hist, vocab, width);
}
extern "C" __global__ void floor_bf16(const B* logits, const uint32_t* words, const uint32_t* params, const float* part_v,
                                      const int* part_i, const uint32_t* hist, uint32_t* floors, int vocab, int width) {
  sala_draw_floor<B, false, 1024>(logits, words, params, part_v, part_i, hist, floors, vocab, width);
}
extern "C" __global__ void pick_bf16(const B* logits, const uint32_t* words, const uint32_t* params, const uint32_t* keys,
                                     const float* part_v, const int* part_i, const uint32_t* floors, uint32_t* token, float* best_v,
                                     int* best_i, int vocab, int width) {
  sala_draw_pick<B, false, 256, true>(logits, words, params, keys, part_v, part_i, floors, token, best_v, best_i, vocab, width);
}
extern "C" __global__ void floor_f32_mask(const float* logits, const uint32_t* words, const uint32_t* params, const float* part_v,
                                          const int* part_i, const uint32_t* hist, uint32_t* floors, int vocab, int width) {
  sala_draw_floor<float, true, 1024>(logits, words, params, part_v, part_i, hist, floors, vocab, width);
}
extern "C" __global__ void pick_f32_mask(const float* logits, const uint32_t* words, const uint32_t* params, const uint32_t* keys,
                                         const float* part_v, const int* part_i, const uint32_t* floors, uint32_t* token,
                                         float* best_v, int* best_i, int vocab, int width) {
  sala_draw_pick<float, true, 256, false>(logits, words, params, keys, part_v, part_i, floors, token, best_v, best_i, vocab, width);
}
extern "C" __global__ void floor_bf16_mask(const B* logits, const uint32_t* words, const uint32_t* params, const float* part_v,
                                           const int* part_i, const uint32_t* hist, uint32_t* floors, int vocab, int width) {
  sala_draw_floor<B, true, 1024>(logits, words, params, part_v, part_i, hist, floors, vocab, width);
}
extern "C" __global__ void floor_f16_mask(const __half* logits, const uint32_t* words, const uint32_t* params, const float* part_v,
                                          const int* part_i, const uint32_t* hist, uint32_t* floors, int vocab, int width) {
  sala_draw_floor<__half, true, 1024>(logits, words, params, part_v, part_i, hist, floors, vocab, width);
}
