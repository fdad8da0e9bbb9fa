// A lightning layer's decode step after its stacked q/k/v(/z) projection, and its output gate.
//
// sala_lightning_step: for sequence b and head h (D / 32 thread blocks of 4·D threads, each taking
// 32 columns of the state; one block of D threads when D is not a multiple of 32), from the
// projection row qkv[b] = [q | k | v | …] (head h at h·D inside each part):
//   q, k ← RMSNorm_D(q, k) · w          (float32, each result rounded to T as MLX's rms_norm does)
//   q, k ← RoPE(q, k) at positions[b]   (rotate-half, inv_freq = θ^(−2i/D), rounded to T)
//   S'   = γ_h S + kᵀ v,  o = scale · q S'   (float32)
// Optionally also writes the rotated k and v (a forward call that may be rolled back keeps them).
// The positions come as the shape of a broadcast (kernels/custom.rs shape_args: position p as
// dimension p + 1) when POS_IN_SHAPE, else from an int array: an array the host wrote each step
// cost the GPU a managed-memory fault in the first lightning layer (24 µs per layer where the
// step takes 5). qkv and the state are read through their strides (the launch does not copy
// inputs, which would materialise the broadcast; a new state may be a broadcast of zeros).
//
// sala_norm_gate: out = RMSNorm_D(o) · w ⊙ σ(z) per row, z taken from the projection row at Z_OFF.
//
// Float constants come as their bit patterns (template ints): compile-time, no upload per step.

template <typename T, int H, int D, int SCALE_BITS, int EPS_BITS, int LOG2_THETA_BITS, bool PER_SEQ, bool POS_IN_SHAPE,
          typename Dims, typename Strides>
__device__ void sala_lightning_step(
    const T* qkv,               // [B, 1, W]
    const Strides& qkv_strides,
    const T* q_norm,            // [D]
    const T* k_norm,            // [D]
    const int* positions,       // [B] (PER_SEQ) or one shared position, unless POS_IN_SHAPE
    const Dims& position_dims,  // the positions + 1 when POS_IN_SHAPE
    const float* slopes,        // [H]
    const float* state,         // [B, H, D, D]
    const Strides& state_strides,
    T* out,                     // [B, H·D]
    float* next_state,          // [B·H, D, D]
    T* k_out,                   // [B·H, D] or null
    T* v_out) {                 // [B·H, D] or null
  __shared__ float qs[D];
  __shared__ float ks[D];
  // Threads j < D prepare q and k (element j each); all of them then share the state.
  const int j = threadIdx.x;
  const bool lead = j < D;
  const int bh = blockIdx.y;
  const int b = bh / H, h = bh % H;
  const int64_t qc = qkv_strides[2];
  const T* row = qkv + b * qkv_strides[0] + h * D * qc;
  const int64_t sr = state_strides[2], sc = state_strides[3];
  const float* sh = state + b * state_strides[0] + h * state_strides[1];
  float* nh = next_state + (size_t)bh * D * D;

  // With D % 32 == 0 thread block blockIdx.x takes 32 columns of the state, lane c column c, and
  // its warps split the rows: a head's state is spread over D / 32 thread blocks of up to 32 warps
  // (one block of D threads per head had left the GPU mostly idle: 59 µs per layer for 2 MB in
  // and 2 MB out on an H100). The thread's rows of the state are loaded first, all at once, and
  // arrive while q and k are prepared (loaded one by one between the stores of the new state they
  // took 24 µs per layer: the stores might have aliased them).
  constexpr bool COLUMNS = D % 32 == 0;
  constexpr int WARPS = COLUMNS ? (4 * D > 1024 ? 1024 : 4 * D) / 32 : 1;
  constexpr int RPW = COLUMNS ? D / WARPS : 1;  // state rows per warp
  const int lane = j & 31, warp = j >> 5;
  const int col = COLUMNS ? blockIdx.x * 32 + lane : j;
  float s_old[RPW];
  if (COLUMNS) {
#pragma unroll
    for (int i = 0; i < RPW; ++i) s_old[i] = __ldg(sh + (warp + i * WARPS) * sr + col * sc);
  }

  const float vj = lead ? static_cast<float>(row[(2 * H * D + j) * qc]) : 0.f;
  const float qj = lead ? static_cast<float>(row[j * qc]) : 0.f;
  const float kj = lead ? static_cast<float>(row[(H * D + j) * qc]) : 0.f;

  // RMSNorm's sums of squares: warp sums meeting in shared memory, or (a block of D threads that
  // is no whole number of warps) every thread summing all of them itself.
  float sq = 0.f, sk = 0.f;
  if (COLUMNS) {
    __shared__ float partial_q[32], partial_k[32];
    float pq = qj * qj, pk = kj * kj;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      pq += __shfl_xor_sync(0xffffffffu, pq, off);
      pk += __shfl_xor_sync(0xffffffffu, pk, off);
    }
    if (lane == 0 && warp < D / 32) {
      partial_q[warp] = pq;
      partial_k[warp] = pk;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < D / 32; ++w) {
      sq += partial_q[w];
      sk += partial_k[w];
    }
  } else {
    if (lead) {
      qs[j] = qj;
      ks[j] = kj;
    }
    __syncthreads();
    if (lead) {
      for (int i = 0; i < D; ++i) {
        sq = fmaf(qs[i], qs[i], sq);
        sk = fmaf(ks[i], ks[i], sk);
      }
    }
    __syncthreads();
  }
  if (lead) {
    const float eps = __int_as_float(EPS_BITS);
    qs[j] = sala_to_t<T>(static_cast<float>(q_norm[j]) * sala_to_t<T>(qj * rsqrtf(sq / D + eps)));
    ks[j] = sala_to_t<T>(static_cast<float>(k_norm[j]) * sala_to_t<T>(kj * rsqrtf(sk / D + eps)));
  }
  __syncthreads();

  // RoPE, rotate-half: pairs (i, i + D/2).
  constexpr int HALF = D / 2;
  float qr = 0.f, kr = 0.f;
  if (lead) {
    const int i = j < HALF ? j : j - HALF;
    const int at = PER_SEQ ? b : 0;
    const float pos = static_cast<float>(POS_IN_SHAPE ? position_dims[at] - 1 : positions[at]);
    const float inv_freq = exp2f(-(static_cast<float>(i) / HALF) * __int_as_float(LOG2_THETA_BITS));
    float sn, cs;
    sincosf(pos * inv_freq, &sn, &cs);
    qr = j < HALF ? qs[j] * cs - qs[j + HALF] * sn : qs[j] * cs + qs[j - HALF] * sn;
    kr = j < HALF ? ks[j] * cs - ks[j + HALF] * sn : ks[j] * cs + ks[j - HALF] * sn;
  }
  __syncthreads();
  if (lead) {
    qs[j] = sala_to_t<T>(qr);
    ks[j] = sala_to_t<T>(kr);
  }
  __syncthreads();
  if (lead && k_out != nullptr && blockIdx.x == 0) {
    k_out[(size_t)bh * D + j] = static_cast<T>(ks[j]);
    v_out[(size_t)bh * D + j] = static_cast<T>(vj);
  }

  const float gamma = expf(-slopes[h]);
  if (COLUMNS) {
    __shared__ float partial[32][32];
    const float vc = static_cast<float>(row[(2 * H * D + col) * qc]);
    float o = 0.f;
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int r = warp + i * WARPS;
      const float s = fmaf(gamma, s_old[i], ks[r] * vc);
      nh[(size_t)r * D + col] = s;
      o = fmaf(qs[r], s, o);
    }
    partial[warp][lane] = o;
    __syncthreads();
    if (warp == 0) {
      float sum = 0.f;
      for (int w = 0; w < WARPS; ++w) sum += partial[w][lane];
      out[(size_t)bh * D + col] = static_cast<T>(sum * __int_as_float(SCALE_BITS));
    }
    return;
  }
  // Otherwise one thread block of D threads per head, thread j owning state column j.
  float o = 0.f;
#pragma unroll 8
  for (int r = 0; r < D; ++r) {
    const float s = fmaf(gamma, sh[r * sr + j * sc], ks[r] * vj);
    nh[(size_t)r * D + j] = s;
    o = fmaf(qs[r], s, o);
  }
  out[(size_t)bh * D + j] = static_cast<T>(o * __int_as_float(SCALE_BITS));
}

// One row per thread block of NT threads (a multiple of 32).
template <typename T, int D, int Z_OFF, int EPS_BITS, int NT>
__device__ void sala_norm_gate(const T* o, const T* gate_row, int W, const T* weight, T* out) {
  __shared__ float partial[NT / 32];
  const int r = blockIdx.y;
  const T* orow = o + (size_t)r * D;
  const T* z = gate_row + (size_t)r * W + Z_OFF;
  float ss = 0.f;
  for (int e = threadIdx.x; e < D; e += NT) {
    const float x = static_cast<float>(orow[e]);
    ss = fmaf(x, x, ss);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) total += partial[w];
  const float inv = rsqrtf(total / D + __int_as_float(EPS_BITS));
  for (int e = threadIdx.x; e < D; e += NT) {
    const float y = sala_to_t<T>(static_cast<float>(weight[e]) * sala_to_t<T>(static_cast<float>(orow[e]) * inv));
    const float g = sala_to_t<T>(1.f / (1.f + expf(-static_cast<float>(z[e]))));
    out[(size_t)r * D + e] = static_cast<T>(y * g);
  }
}
