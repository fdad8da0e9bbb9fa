// 16 bytes of keys, values or inputs as floats (8 bf16/f16 values, 4 float32), shared by the
// kernels that read their operands in 16-byte pieces (qmv.cu, block_sparse_attention.cu).

__device__ __forceinline__ void sala_unpack16(const uint4& u, const __nv_bfloat16*, float* out) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void sala_unpack16(const uint4& u, const __half*, float* out) {
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void sala_unpack16(const uint4& u, const float*, float* out) {
  out[0] = __uint_as_float(u.x);
  out[1] = __uint_as_float(u.y);
  out[2] = __uint_as_float(u.z);
  out[3] = __uint_as_float(u.w);
}

// 8 consecutive values at p (16-byte aligned) as floats.
template <typename T>
__device__ __forceinline__ void sala_load8(const T* p, float* out) {
  constexpr int PER_PIECE = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < 8; i += PER_PIECE) sala_unpack16(*reinterpret_cast<const uint4*>(p + i), p, out + i);
}
