// A float rounded to T and back: the kernels round where MLX's operations return T.
template <typename T>
__device__ __forceinline__ float sala_to_t(float v) { return static_cast<float>(static_cast<T>(v)); }

// The epilogues of a product y, rounded as MLX's separate operations round them (the decode
// kernels of qmv.cu and qmv_mma.cu, and epilogue.cu for prompt rows): residual + alpha · y, and
// silu(gate) · up.
template <typename T>
__device__ __forceinline__ T sala_residual_add(T residual, float alpha, float product) {
  return static_cast<T>(static_cast<float>(residual) + sala_to_t<T>(alpha * sala_to_t<T>(product)));
}

template <typename T>
__device__ __forceinline__ T sala_swiglu(float gate, float up) {
  const float g = sala_to_t<T>(gate);
  const float act = sala_to_t<T>(g * sala_to_t<T>(1.f / (1.f + expf(-g))));
  return static_cast<T>(act * sala_to_t<T>(up));
}
