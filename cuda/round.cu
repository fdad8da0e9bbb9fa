// A float rounded to T and back: the kernels round where MLX's operations return T.
template <typename T>
__device__ __forceinline__ float sala_to_t(float v) { return static_cast<float>(static_cast<T>(v)); }
