// Metal twin of cuda/gla_decode.cu: thread (j, b·H + h) owns column j of sequence b's head h state.
// Untested on hardware.

template <typename T, int H, int DK, int DV, int SCALE_BITS>
inline void sala_gla_decode(
    const device T* q, const device T* k, const device T* v, const device float* slopes,
    const device float* state, device T* out, device float* next_state,
    uint j, uint h) {
  if (int(j) >= DV) return;
  const float gamma = exp(-slopes[h % H]);
  const float vj = float(v[h * DV + j]);
  const device float* sh = state + size_t(h) * DK * DV;
  device float* nh = next_state + size_t(h) * DK * DV;
  float o = 0.f;
  for (int i = 0; i < DK; ++i) {
    const float s = fma(gamma, sh[size_t(i) * DV + j], float(k[h * DK + i]) * vj);
    nh[size_t(i) * DV + j] = s;
    o = fma(float(q[h * DK + i]), s, o);
  }
  out[h * DV + j] = T(o * as_type<float>(SCALE_BITS));
}
