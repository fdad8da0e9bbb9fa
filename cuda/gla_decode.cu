// One decode step of Simple GLA for every head of every sequence in the batch, reading and
// writing the float32 state once (q, k, v and the output in the model's dtype T, arithmetic in
// float32):
//   S' = γ_h S + k_hᵀ v_h,   o_h = scale · q_h S'
// Thread (j, b·H + h) owns column j of sequence b's head h [DK, DV] state; consecutive threads
// touch consecutive columns, so every state row is one coalesced access.

template <typename T, int H, int DK, int DV, int SCALE_BITS>
__device__ void sala_gla_decode(
    const T* q,            // [B·H, DK]
    const T* k,            // [B·H, DK]
    const T* v,            // [B·H, DV]
    const float* slopes,   // [H]  γ_h = exp(−slope_h)
    const float* state,    // [B·H, DK, DV]
    T* out,                // [B·H, DV]
    float* next_state) {   // [B·H, DK, DV]
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;  // b·H + head
  if (j >= DV) return;
  const float gamma = expf(-slopes[h % H]);
  const float vj = static_cast<float>(v[h * DV + j]);
  const float* sh = state + (size_t)h * DK * DV;
  float* nh = next_state + (size_t)h * DK * DV;
  float o = 0.f;
#pragma unroll 8
  for (int i = 0; i < DK; ++i) {
    const float s = fmaf(gamma, sh[(size_t)i * DV + j], static_cast<float>(k[h * DK + i]) * vj);
    nh[(size_t)i * DV + j] = s;
    o = fmaf(static_cast<float>(q[h * DK + i]), s, o);
  }
  out[h * DV + j] = static_cast<T>(o * __int_as_float(SCALE_BITS));  // the scale, passed as its bit pattern
}
