// Metal twin of cuda/qmv.cu (same arithmetic and row assignment: NR output rows per simdgroup;
// plain, SwiGLU and residual forms; CUDA also splits K over warps for matrices of few rows, and
// has a tensor-core form for 2–16 input rows, cuda/qmv_mma.cu). Untested on hardware.
//   y[r, n] = sum_k x[r, k] * (scale[n, g] * q[n, k] + bias[n, g]),   g = k / GROUP

// The simdgroup's sums for output row n of every input row, in every lane's acc.
template <typename T, int BITS, int GROUP, int ROWS>
inline void sala_qmv_row(
    const device T* x, const device uint32_t* w, const device T* scales, const device T* biases,
    int n, int K, uint lane, thread float* acc) {
  constexpr int PER_CHUNK = 128 / BITS;
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int chunks = K / PER_CHUNK;
  const int groups = K / GROUP;
  const device uint4* row = reinterpret_cast<const device uint4*>(w) + size_t(n) * chunks;
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.f;
  for (int c = int(lane); c < chunks; c += 32) {
    const uint4 packed = row[c];
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    const int k0 = c * PER_CHUNK;
    const float s = float(scales[size_t(n) * groups + k0 / GROUP]);
    const float b = float(biases[size_t(n) * groups + k0 / GROUP]);
    for (int r = 0; r < ROWS; ++r) {
      const device T* xr = x + size_t(r) * K + k0;
      float dot = 0.f, sum = 0.f;
      for (int i = 0; i < PER_CHUNK; ++i) {
        const float xi = float(xr[i]);
        dot = fma(xi, float((words[i / PER_WORD] >> ((i % PER_WORD) * BITS)) & MASK), dot);
        sum += xi;
      }
      acc[r] = fma(s, dot, fma(b, sum, acc[r]));
    }
  }
  for (int r = 0; r < ROWS; ++r) acc[r] = simd_sum(acc[r]);
}

template <typename T>
inline float sala_round(float v) { return float(T(v)); }

// Simdgroup `sg` computes the NR output rows from sg · NR (as the CUDA kernel's warps do).
template <typename T, int BITS, int GROUP, int ROWS, int NR>
inline void sala_qmv(
    const device T* x, const device uint32_t* w, const device T* scales, const device T* biases,
    device T* y, int N, int K, uint lane, uint sg) {
  for (int m = 0; m < NR; ++m) {
    const int n = int(sg) * NR + m;
    if (n >= N) return;
    float acc[ROWS];
    sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, n, K, lane, acc);
    if (lane == 0) {
      for (int r = 0; r < ROWS; ++r) y[size_t(r) * N + n] = T(acc[r]);
    }
  }
}

// SwiGLU of a stacked [gate; up] matrix [2F, K]: y[r, n] = silu(g) · u; NR / 2 outputs per simdgroup.
template <typename T, int BITS, int GROUP, int ROWS, int NR>
inline void sala_qmv_swiglu(
    const device T* x, const device uint32_t* w, const device T* scales, const device T* biases,
    device T* y, int F, int K, uint lane, uint sg) {
  for (int m = 0; m < NR / 2; ++m) {
    const int n = int(sg) * (NR / 2) + m;
    if (n >= F) return;
    float gate[ROWS], up[ROWS];
    sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, n, K, lane, gate);
    sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, F + n, K, lane, up);
    if (lane == 0) {
      for (int r = 0; r < ROWS; ++r) {
        const float g = sala_round<T>(gate[r]);
        const float act = sala_round<T>(g * sala_round<T>(1.f / (1.f + exp(-g))));
        y[size_t(r) * F + n] = T(act * sala_round<T>(up[r]));
      }
    }
  }
}

// y = residual + alpha · (x · Wᵀ), alpha the bit pattern of its value in T.
template <typename T, int BITS, int GROUP, int ROWS, int NR, int ALPHA_BITS>
inline void sala_qmv_residual(
    const device T* x, const device uint32_t* w, const device T* scales, const device T* biases,
    const device T* residual, device T* y, int N, int K, uint lane, uint sg) {
  const float a = as_type<float>(ALPHA_BITS);
  for (int m = 0; m < NR; ++m) {
    const int n = int(sg) * NR + m;
    if (n >= N) return;
    float acc[ROWS];
    sala_qmv_row<T, BITS, GROUP, ROWS>(x, w, scales, biases, n, K, lane, acc);
    if (lane == 0) {
      for (int r = 0; r < ROWS; ++r) {
        const size_t i = size_t(r) * N + n;
        y[i] = T(float(residual[i]) + sala_round<T>(a * sala_round<T>(acc[r])));
      }
    }
  }
}
