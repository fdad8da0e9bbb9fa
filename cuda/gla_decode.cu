// One decode step of Simple GLA for every head of every sequence in the batch, reading and
// writing the float32 state once:
//   S' = γ_h S + k_hᵀ v_h,   o_h = scale · q_h S'
// Thread (j, b·H + h) owns column j of sequence b's head h [DK, DV] state; consecutive threads
// touch consecutive columns, so every state row is one coalesced access.

template <int H, int DK, int DV, int SCALE_BITS>
__device__ void sala_gla_decode(
    const float* q,        // [B·H, DK]
    const float* k,        // [B·H, DK]
    const float* v,        // [B·H, DV]
    const float* slopes,   // [H]  γ_h = exp(−slope_h)
    const float* state,    // [B·H, DK, DV]
    float* out,            // [B·H, DV]
    float* next_state) {   // [B·H, DK, DV]
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;  // b·H + head
  if (j >= DV) return;
  const float gamma = expf(-slopes[h % H]);
  const float vj = v[h * DV + j];
  const float* sh = state + (size_t)h * DK * DV;
  float* nh = next_state + (size_t)h * DK * DV;
  float o = 0.f;
#pragma unroll 8
  for (int i = 0; i < DK; ++i) {
    const float s = fmaf(gamma, sh[(size_t)i * DV + j], k[h * DK + i] * vj);
    nh[(size_t)i * DV + j] = s;
    o = fmaf(q[h * DK + i], s, o);
  }
  out[h * DV + j] = o * __int_as_float(SCALE_BITS);  // the scale, passed as its bit pattern
}
