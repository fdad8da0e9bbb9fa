// The step after a prompt chunk's product, on its many rows (a decode step's kernels fuse it into
// the product instead, qmv.cu): MLX runs SwiGLU as a sigmoid and two multiplies over the strided
// halves of the stacked [gate | up] product, and the residual branch as a multiply and an add,
// each a pass over memory. Here one pass each, rounded as those operations round (round.cu).
// Each thread writes one 16-byte piece of the output (VEC values of one row).

// out[r, c] = silu(y[r, c]) · y[r, F + c] for y [R, 2F] (F a multiple of VEC).
template <typename T>
__device__ void sala_swiglu_rows(const T* y, T* out, int F, size_t pieces) {
  constexpr int VEC = 16 / sizeof(T);
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pieces) return;
  const size_t first = i * VEC;
  const size_t r = first / F, c = first % F;
  const uint4 gate = *reinterpret_cast<const uint4*>(y + r * 2 * F + c);
  const uint4 up = *reinterpret_cast<const uint4*>(y + r * 2 * F + F + c);
  const T* g = reinterpret_cast<const T*>(&gate);
  const T* u = reinterpret_cast<const T*>(&up);
  T values[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) values[j] = sala_swiglu<T>(static_cast<float>(g[j]), static_cast<float>(u[j]));
  reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(values);
}

// out = residual + alpha · y, elementwise over arrays of pieces · VEC values; alpha is the bit
// pattern ALPHA_BITS of its value rounded to T.
template <typename T, int ALPHA_BITS>
__device__ void sala_residual_rows(const T* y, const T* residual, T* out, size_t pieces) {
  constexpr int VEC = 16 / sizeof(T);
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pieces) return;
  const float alpha = __int_as_float(ALPHA_BITS);
  const uint4 yv = reinterpret_cast<const uint4*>(y)[i];
  const uint4 rv = reinterpret_cast<const uint4*>(residual)[i];
  const T* p = reinterpret_cast<const T*>(&yv);
  const T* res = reinterpret_cast<const T*>(&rv);
  T values[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) values[j] = sala_residual_add<T>(res[j], alpha, static_cast<float>(p[j]));
  reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(values);
}
