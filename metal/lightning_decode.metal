// Metal twin of cuda/lightning_decode.cu (same arithmetic and roundings; one threadgroup per head,
// where CUDA spreads a head over d / 32 thread blocks and sums o in another order). Untested on
// hardware.

template <typename T>
inline float sala_to_t(float v) { return float(T(v)); }

// Positions, strides and broadcasts as in the CUDA kernel.
template <typename T, int H, int D, int SCALE_BITS, int EPS_BITS, int LOG2_THETA_BITS, bool PER_SEQ, bool POS_IN_SHAPE>
inline void sala_lightning_step(
    const device T* qkv, const constant int64_t* qkv_strides, const device T* q_norm, const device T* k_norm,
    const device int* positions, const constant int* position_dims, const device float* slopes,
    const device float* state, const constant int64_t* state_strides,
    device T* out, device float* next_state, device T* k_out, device T* v_out,
    threadgroup float* qs, threadgroup float* ks, uint j, uint bh) {
  const int b = int(bh) / H, h = int(bh) % H;
  const int64_t qc = qkv_strides[2];
  const device T* row = qkv + b * qkv_strides[0] + h * D * qc;
  const float vj = float(row[(2 * H * D + j) * qc]);
  qs[j] = float(row[j * qc]);
  ks[j] = float(row[(H * D + j) * qc]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float sq = 0.f, sk = 0.f;
  for (int i = 0; i < D; ++i) {
    sq = fma(qs[i], qs[i], sq);
    sk = fma(ks[i], ks[i], sk);
  }
  const float eps = as_type<float>(EPS_BITS);
  const float qn = sala_to_t<T>(float(q_norm[j]) * sala_to_t<T>(qs[j] * rsqrt(sq / D + eps)));
  const float kn = sala_to_t<T>(float(k_norm[j]) * sala_to_t<T>(ks[j] * rsqrt(sk / D + eps)));
  threadgroup_barrier(mem_flags::mem_threadgroup);
  qs[j] = qn;
  ks[j] = kn;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  constexpr int HALF = D / 2;
  const int i = int(j) < HALF ? int(j) : int(j) - HALF;
  const int at = PER_SEQ ? b : 0;
  const float pos = float(POS_IN_SHAPE ? position_dims[at] - 1 : positions[at]);
  const float angle = pos * exp2(-(float(i) / HALF) * as_type<float>(LOG2_THETA_BITS));
  const float sn = precise::sin(angle), cs = precise::cos(angle);
  const float qr = int(j) < HALF ? qs[j] * cs - qs[j + HALF] * sn : qs[j] * cs + qs[j - HALF] * sn;
  const float kr = int(j) < HALF ? ks[j] * cs - ks[j + HALF] * sn : ks[j] * cs + ks[j - HALF] * sn;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  qs[j] = sala_to_t<T>(qr);
  ks[j] = sala_to_t<T>(kr);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (k_out) {
    k_out[size_t(bh) * D + j] = T(ks[j]);
    v_out[size_t(bh) * D + j] = T(vj);
  }
  const float gamma = exp(-slopes[h]);
  const int64_t sr = state_strides[2], sc = state_strides[3];
  const device float* sh = state + b * state_strides[0] + h * state_strides[1];
  device float* nh = next_state + size_t(bh) * D * D;
  float o = 0.f;
  for (int r = 0; r < D; ++r) {
    const float s = fma(gamma, sh[r * sr + j * sc], ks[r] * vj);
    nh[size_t(r) * D + j] = s;
    o = fma(qs[r], s, o);
  }
  out[size_t(bh) * D + j] = T(o * as_type<float>(SCALE_BITS));
}

template <typename T, int D, int Z_OFF, int EPS_BITS, int NT>
inline void sala_norm_gate(
    const device T* o, const device T* gate_row, int W, const device T* weight, device T* out,
    threadgroup float* partial, uint t, uint r, uint lane, uint warp) {
  const device T* orow = o + size_t(r) * D;
  const device T* z = gate_row + size_t(r) * W + Z_OFF;
  float ss = 0.f;
  for (int e = int(t); e < D; e += NT) {
    const float x = float(orow[e]);
    ss = fma(x, x, ss);
  }
  ss = simd_sum(ss);
  if (lane == 0) partial[warp] = ss;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.f;
  for (int w = 0; w < NT / 32; ++w) total += partial[w];
  const float inv = rsqrt(total / D + as_type<float>(EPS_BITS));
  for (int e = int(t); e < D; e += NT) {
    const float y = sala_to_t<T>(float(weight[e]) * sala_to_t<T>(float(orow[e]) * inv));
    const float g = sala_to_t<T>(1.f / (1.f + exp(-float(z[e]))));
    out[size_t(r) * D + e] = T(y * g);
  }
}
