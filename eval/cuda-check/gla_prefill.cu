// The GLA prompt kernels (cuda/gla_prefill.cu) in the form SALA-9B launches (d = 128: 64 output
// columns a block, the state's dk tile of 32; src/kernels/gla.rs) and in the 32-column form of
// d = 32, for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned int uint32_t;
typedef int int32_t;
#define INFINITY __int_as_float(0x7f800000)  // MLX's preamble defines it at run time
#include "cuda/mma.cu"
#include "cuda/attention_mma.cu"
#include "cuda/gla_prefill.cu"
using T = __nv_bfloat16;
constexpr int SCALE = 0x3db504f3;  // 128^-0.5

extern "C" __global__ void chunk_states(const T* k, const T* v, const float* slopes, const float* state, T* entering, float* next_state, int heads, int t_len) {
  sala_gla_chunk_states<128, 128, 32, 64>(k, v, slopes, state, entering, next_state, heads, t_len);
}
extern "C" __global__ void chunk_output(const T* q, const T* k, const T* v, const float* slopes, const T* entering, T* out, int heads, int t_len) {
  sala_gla_chunk_output<128, 128, 64, SCALE>(q, k, v, slopes, entering, out, heads, t_len);
}
extern "C" __global__ void chunk_states_32(const T* k, const T* v, const float* slopes, const float* state, T* entering, float* next_state, int heads, int t_len) {
  sala_gla_chunk_states<32, 32, 32, 32>(k, v, slopes, state, entering, next_state, heads, t_len);
}
extern "C" __global__ void chunk_output_32(const T* q, const T* k, const T* v, const float* slopes, const T* entering, T* out, int heads, int t_len) {
  sala_gla_chunk_output<32, 32, 32, SCALE>(q, k, v, slopes, entering, out, heads, t_len);
}
