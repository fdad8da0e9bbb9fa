// 16 bytes of keys, values or inputs as floats (8 bf16/f16 values, 4 float32, 16 8-bit codes),
// shared by the kernels that read their operands in 16-byte pieces (qmv.cu, the attention kernels).

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

// The first N 8-bit codes of u (MLX's affine format: code i of a u32 word in its byte i) as
// floats, code · scale + bias, for the readers of an 8-bit KV cache.
template <int N>
__device__ __forceinline__ void sala_dequant(const uint4& u, float scale, float bias, float* out) {
  static_assert(N % 4 == 0 && N <= 16, "whole words of one 16-byte piece");
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
#pragma unroll
    for (int b = 0; b < 4; ++b) out[4 * i + b] = fmaf(static_cast<float>((w[i] >> (8 * b)) & 0xFFu), scale, bias);
  }
}

__device__ __forceinline__ void sala_dequant16(const uint4& u, float scale, float bias, float* out) {
  sala_dequant<16>(u, scale, bias, out);
}

// N 8-bit codes at p (N/4 words, aligned to their size) into the first words of a 16-byte piece.
template <int N>
__device__ __forceinline__ uint4 sala_load_codes(const uint32_t* p) {
  static_assert(N == 4 || N == 8 || N == 16, "one, two or four words");
  if constexpr (N == 16) return *reinterpret_cast<const uint4*>(p);
  if constexpr (N == 8) {
    const uint2 c = *reinterpret_cast<const uint2*>(p);
    return make_uint4(c.x, c.y, 0u, 0u);
  }
  if constexpr (N == 4) return make_uint4(*p, 0u, 0u, 0u);
}

// An 8-bit cache's scales and biases, [Hkv, cap or rcap, D / group] in T, beside its codes (MLX's
// affine format: value = code · scale + bias); unused, and null, for plain rows.
template <typename T>
struct SalaKvScales {
  const T *k_scales, *k_biases, *v_scales, *v_biases;      // the history's
  const T *kr_scales, *kr_biases, *vr_scales, *vr_biases;  // the recent tokens'
  int cap, rcap;                                           // their buffers' capacities

  // Where the scale and bias of the group holding column c of token row `row` of KV head h are.
  template <int D, int GROUP>
  __device__ size_t at(int h, bool history, size_t row, int c) const {
    return ((size_t)h * (history ? cap : rcap) + row) * (D / GROUP) + c / GROUP;
  }
};
