// Metal twin of cuda/qmv.cu (same arithmetic, one simdgroup per output n). Untested on hardware.
//   y[r, n] = sum_k x[r, k] * (scale[n, g] * q[n, k] + bias[n, g]),   g = k / GROUP

template <typename T, int BITS, int GROUP, int ROWS>
inline void sala_qmv(
    const device T* x, const device uint32_t* w, const device T* scales, const device T* biases,
    device T* y, int N, int K, uint lane, uint n) {
  constexpr int PER_CHUNK = 128 / BITS;
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  if (int(n) >= N) return;
  const int chunks = K / PER_CHUNK;
  const int groups = K / GROUP;
  const device uint4* row = reinterpret_cast<const device uint4*>(w) + size_t(n) * chunks;
  float acc[ROWS];
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
  for (int r = 0; r < ROWS; ++r) {
    const float v = simd_sum(acc[r]);
    if (lane == 0) y[size_t(r) * N + n] = T(v);
  }
}
