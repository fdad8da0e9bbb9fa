// Quantized matrix-vector product for decode (a few rows of input), plain or with the SwiGLU or
// residual step that follows it fused in:
//   y[r, n] = sum_k x[r, k] * (scale[n, g] * q[n, k] + bias[n, g]),   g = k / GROUP
// with MLX's packing: BITS-bit values little-endian in uint32 words, groups of GROUP along k.
//
// One warp per output n; each lane streams 16-byte chunks of the packed row (16 weights at 8 bits,
// 32 at 4), four chunks in flight, and the warp reduces at the end. Weight bytes are read once;
// x is small and stays in L1/L2 and is read 16 bytes at a time. Quantized values become floats
// through the exponent trick (0x4B000000 | q is the float 2^23 + q), which is cheaper than an
// integer conversion. Accumulation is float32.

__device__ __forceinline__ void sala_load8(const __nv_bfloat16* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void sala_load8(const __half* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ void sala_load8(const float* p, float* out) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// The warp's sums for output row n of every input row, reduced into every lane's acc.
template <typename T, int BITS, int GROUP, int ROWS>
__device__ __forceinline__ void sala_qmv_row(
    const T* x, const uint32_t* w, const T* scales, const T* biases, int n, int K, float* acc) {
  constexpr int PER_CHUNK = 128 / BITS;       // weights per 16-byte chunk
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int lane = threadIdx.x & 31;
  const int chunks = K / PER_CHUNK;
  const int groups = K / GROUP;
  const uint4* row = reinterpret_cast<const uint4*>(w) + (size_t)n * chunks;
  const T* srow = scales + (size_t)n * groups;
  const T* brow = biases + (size_t)n * groups;

#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;

  auto consume = [&](uint4 packed, int c) {
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    float q[PER_CHUNK];
#pragma unroll
    for (int i = 0; i < PER_CHUNK; ++i) {
      q[i] = __uint_as_float(0x4B000000u | ((words[i / PER_WORD] >> ((i % PER_WORD) * BITS)) & MASK)) - 8388608.f;
    }
    const int k0 = c * PER_CHUNK;
    const float s = static_cast<float>(srow[k0 / GROUP]);
    const float b = static_cast<float>(brow[k0 / GROUP]);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const T* xr = x + (size_t)r * K + k0;
      float dot = 0.f, sum = 0.f;
#pragma unroll
      for (int i = 0; i < PER_CHUNK; i += 8) {
        float xv[8];
        sala_load8(xr + i, xv);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          dot = fmaf(xv[j], q[i + j], dot);
          sum += xv[j];
        }
      }
      acc[r] = fmaf(s, dot, fmaf(b, sum, acc[r]));
    }
  };

  int c = lane;
  for (; c + 96 < chunks; c += 128) {
    uint4 in_flight[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) in_flight[u] = __ldg(row + c + 32 * u);
#pragma unroll
    for (int u = 0; u < 4; ++u) consume(in_flight[u], c + 32 * u);
  }
  for (; c < chunks; c += 32) consume(__ldg(row + c), c);

#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
}

template <typename T>
__device__ __forceinline__ float sala_round(float v) { return static_cast<float>(static_cast<T>(v)); }

// y = x · Wᵀ, W [N, K].
template <typename T, int BITS, int GROUP, int ROWS, int WARPS>
__device__ __forceinline__ void sala_qmv(
    const T* x, const uint32_t* w, const T* scales, const T* biases, T* y, int N, int K) {
  const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (n >= N) return;
  float acc[ROWS];
  sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, n, K, acc);
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) y[(size_t)r * N + n] = static_cast<T>(acc[r]);
}

// SwiGLU of a stacked [gate; up] matrix W [2F, K]: y[r, n] = silu(g) · u for g, u the products with
// rows n and F + n, each intermediate rounded to T as the separate operations round it.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS>
__device__ __forceinline__ void sala_qmv_swiglu(
    const T* x, const uint32_t* w, const T* scales, const T* biases, T* y, int F, int K) {
  const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (n >= F) return;
  float gate[ROWS], up[ROWS];
  sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, n, K, gate);
  sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, F + n, K, up);
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float g = sala_round<T>(gate[r]);
    const float act = sala_round<T>(g * sala_round<T>(1.f / (1.f + expf(-g))));
    y[(size_t)r * F + n] = static_cast<T>(act * sala_round<T>(up[r]));
  }
}

// y = residual + alpha · (x · Wᵀ), rounded as the separate operations round it.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS>
__device__ __forceinline__ void sala_qmv_residual(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const T* residual, const T* alpha,
    T* y, int N, int K) {
  const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (n >= N) return;
  float acc[ROWS];
  sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, n, K, acc);
  if ((threadIdx.x & 31) != 0) return;
  const float a = static_cast<float>(alpha[0]);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const size_t i = (size_t)r * N + n;
    y[i] = static_cast<T>(static_cast<float>(residual[i]) + sala_round<T>(a * sala_round<T>(acc[r])));
  }
}
