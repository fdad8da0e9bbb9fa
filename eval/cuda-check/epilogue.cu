// The prompt products' SwiGLU and residual steps (cuda/epilogue.cu) in bf16, as
// src/kernels/epilogue.rs launches them; for eval/cuda_compile_check.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "cuda/round.cu"
#include "cuda/epilogue.cu"
using T = __nv_bfloat16;
constexpr int ALPHA = 0x3e1c0000;  // 0.152 in bf16

extern "C" __global__ void swiglu(const T* y, T* out, int F, size_t pieces) { sala_swiglu_rows<T>(y, out, F, pieces); }
extern "C" __global__ void residual(const T* y, const T* r, T* out, size_t pieces) { sala_residual_rows<T, ALPHA>(y, r, out, pieces); }
