// Simple GLA over a prompt on tensor cores (CUDA, sm_80 and later): the chunked form of gla.rs in
// two kernels, for bf16 q, k, v [B·H, T, D] (row-contiguous) and a float32 state [B·H, DK, DV].
//   sala_gla_chunk_states  walks the 64-token chunks once per tile of the state,
//                          S ← γ^L S + Σ_{j<L} γ^{L−1−j} k_jᵀ v_j  (L the chunk's length),
//                          writing the state entering each chunk and the state after the last.
//   sala_gla_chunk_output  one chunk of one head and VT output columns per block:
//                          o_i = scale · (Σ_{j≤i} γ^{i−j} (q_i·k_j) v_j + γ^{i+1} q_i S_c),
//                          written as rows [B, T, H, DV], the layout the output projection reads.
// A float32 operand (decayed values, decayed scores, states) enters a product as two bf16 parts
// hi + lo: 16 significant bits, finer than the TF32 that MLX's float32 products round to. q, k
// and v are bf16 already, so their products are exact. The entering states are kept so, in the
// order the output kernel's mma B fragments take them: [B·H, chunks, DV / 8, DK / 16, 32 lanes,
// 4 words (hi k, hi k + 8, lo k, lo k + 8)], one 16-byte store and load a fragment pair. The lane
// of the states kernel that holds a state element is the lane of the output kernel that needs it.
// Needs mma.cu and attention_mma.cu (sala_score_tiles).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_gla_chunk_* need mma.sync for bf16 and cp.async (compute capability 8.0 or later)"
#endif

#define SALA_GLA_CHUNK 64

// Two floats as bf16 pairs hi and lo with hi + lo ≈ (x0, x1) to 16 significant bits.
__device__ inline void sala_split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 back = __bfloat1622float2(h);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = sala_pack(x0 - back.x, x1 - back.y, __nv_bfloat16());
}

__device__ inline float2 sala_unpack_pair(uint32_t r) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
}

// Rows row0 .. row0 + 63 and columns col0 .. col0 + W − 1 of x [n, D] into dst [64][W + 8]
// asynchronously, zeros for rows ≥ n. The caller commits.
template <int D, int W, int THREADS>
__device__ inline void sala_gla_stage(__nv_bfloat16* dst, const __nv_bfloat16* x, int row0, int col0, int n, int tid) {
  constexpr int PIECES = SALA_GLA_CHUNK * W / 8;  // 16-byte pieces
  static_assert(PIECES % THREADS == 0, "whole pieces per thread");
#pragma unroll
  for (int i = 0; i < PIECES / THREADS; ++i) {
    const int e = i * THREADS + tid, j = e / (W / 8), col = (e % (W / 8)) * 8;
    const bool ok = row0 + j < n;
    sala_cp_async16(dst + j * (W + 8) + col, ok ? x + (size_t)(row0 + j) * D + col0 + col : x, ok);
  }
}

// Block (x, y, bh) of 2·VT threads owns the transposed state's rows dv ∈ [VT·x, VT·x + VT) (warp w:
// 16 of them) and columns dk ∈ [BN·y, BN·y + BN): Sᵀ += (γ-weighted V)ᵀ K, the weights on the
// values (A, split hi + lo) so that the keys (B) stay exact. K and V tiles of the next two chunks
// are copied while this one is folded in (the walk is sequential: each chunk's loads must arrive
// behind the work of the ones before).
template <int DK, int DV, int BN, int VT>
__device__ void sala_gla_chunk_states(const __nv_bfloat16* k, const __nv_bfloat16* v, const float* slopes, const float* state,
                                      __nv_bfloat16* entering, float* next_state, int heads, int t_len) {
  constexpr int C = SALA_GLA_CHUNK, VS = VT + 8, KS = BN + 8, NT = BN / 8, THREADS = 2 * VT;
  static_assert(NT % 2 == 0 && VT % 16 == 0 && DV % VT == 0 && DK % BN == 0, "tiles of the state");
  constexpr int STAGES = 3;
  __shared__ __align__(16) __nv_bfloat16 vs[STAGES][C * VS];
  __shared__ __align__(16) __nv_bfloat16 ks[STAGES][C * KS];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.z, m0 = blockIdx.x * VT + 16 * w, n0 = blockIdx.y * BN;
  const int chunks = (t_len + C - 1) / C;
  const float slope = slopes[bh % heads];
  const __nv_bfloat16* kh = k + (size_t)bh * t_len * DK;
  const __nv_bfloat16* vh = v + (size_t)bh * t_len * DV;
  // s[nt][e] = Sᵀ[m0 + g + 8(e >> 1)][n0 + 8nt + 2t + (e & 1)] = S[dk][dv].
  float s[NT][4];
  const float* s0 = state + (size_t)bh * DK * DV;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = s0[(size_t)(n0 + 8 * nt + 2 * t + (e & 1)) * DV + m0 + g + 8 * (e >> 1)];
  // Chunk c's tiles into buffer c % STAGES: one commit group, empty past the last chunk.
  auto stage = [&](int c) {
    if (c < chunks) {
      sala_gla_stage<DV, VT, THREADS>(vs[c % STAGES], vh, c * C, blockIdx.x * VT, t_len, tid);
      sala_gla_stage<DK, BN, THREADS>(ks[c % STAGES], kh, c * C, n0, t_len, tid);
    }
    asm volatile("cp.async.commit_group;");
  };
#pragma unroll
  for (int c = 0; c < STAGES - 1; ++c) stage(c);
  for (int c = 0; c < chunks; ++c) {
    stage(c + STAGES - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1));
    __syncthreads();
    uint4* frag = reinterpret_cast<uint4*>(entering) + ((size_t)bh * chunks + c) * (DV / 8) * (DK / 16) * 32;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint4 x;
        sala_split_pair(s[nt][2 * half], s[nt][2 * half + 1], x.x, x.z);
        sala_split_pair(s[nt + 1][2 * half], s[nt + 1][2 * half + 1], x.y, x.w);
        frag[((size_t)(m0 / 8 + half) * (DK / 16) + (n0 + 8 * nt) / 16) * 32 + lane] = x;
      }
    const int len = min(C, t_len - c * C);
    const float decay = expf(-slope * len);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= decay;
    const __nv_bfloat16 *vt = vs[c % STAGES], *kt = ks[c % STAGES];
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      // A = Vᵀ: rows dv, columns the 16 tokens 16kk ..; register r holds tokens 16kk + 2t + 8(r >> 1) and the next.
      uint32_t a[4], ahi[4], alo[4];
      sala_ldmatrix_x4_trans(a, vt + (16 * kk + (lane & 7) + 8 * ((lane >> 4) & 1)) * VS + 16 * w + 8 * ((lane >> 3) & 1));
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = 16 * kk + 2 * t + 8 * (r >> 1);
        const float2 x = sala_unpack_pair(a[r]);
        const float w0 = j < len ? expf(-slope * (len - 1 - j)) : 0.f, w1 = j + 1 < len ? expf(-slope * (len - 2 - j)) : 0.f;
        sala_split_pair(x.x * w0, x.y * w1, ahi[r], alo[r]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t b[4];
        sala_ldmatrix_x4_trans(b, kt + (16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1)) * KS + 8 * nt + 8 * (lane >> 4));
        sala_mma(s[nt], ahi, b[0], b[1], __nv_bfloat16());
        sala_mma(s[nt], alo, b[0], b[1], __nv_bfloat16());
        sala_mma(s[nt + 1], ahi, b[2], b[3], __nv_bfloat16());
        sala_mma(s[nt + 1], alo, b[2], b[3], __nv_bfloat16());
      }
    }
    __syncthreads();  // this chunk's buffers are free for chunk c + STAGES
  }
  float* s1 = next_state + (size_t)bh * DK * DV;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s1[(size_t)(n0 + 8 * nt + 2 * t + (e & 1)) * DV + m0 + g + 8 * (e >> 1)] = s[nt][e];
}

// Block (c, bh, z) of 128 threads: chunk c of head bh, output columns [VT·z, VT·z + VT); warp w
// takes the chunk's queries 16w .. 16w + 15. The state's part is computed while K and V arrive.
template <int DK, int DV, int VT, int SCALE_BITS>
__device__ void sala_gla_chunk_output(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, const float* slopes,
                                      const __nv_bfloat16* entering, __nv_bfloat16* out, int heads, int t_len) {
  constexpr int C = SALA_GLA_CHUNK, QS = DK + 8, VS = VT + 8, NT = VT / 8;
  static_assert(DK % 32 == 0 && NT % 2 == 0 && DV % VT == 0, "whole tiles");
  __shared__ __align__(16) __nv_bfloat16 qs[C * QS];
  __shared__ __align__(16) __nv_bfloat16 ks[C * QS];
  __shared__ __align__(16) __nv_bfloat16 vs[C * VS];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
  const int c = blockIdx.x, bh = blockIdx.y, col0 = blockIdx.z * VT, row0 = c * C;
  const float slope = slopes[bh % heads];
  sala_gla_stage<DK, DK, 128>(qs, q + (size_t)bh * t_len * DK, row0, 0, t_len, tid);
  asm volatile("cp.async.commit_group;");
  sala_gla_stage<DK, DK, 128>(ks, k + (size_t)bh * t_len * DK, row0, 0, t_len, tid);
  sala_gla_stage<DV, VT, 128>(vs, v + (size_t)bh * t_len * DV, row0, col0, t_len, tid);
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_group 1;");
  __syncthreads();
  uint32_t qa[DK / 16][4];
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk) sala_ldmatrix_x4(qa[kk], qs + (16 * w + (lane & 15)) * QS + 16 * kk + 8 * (lane >> 4));

  // γ^{i+1} q_i S_c: B fragments straight from the entering state's hi and lo parts.
  float o[NT][4] = {};
  const uint4* sc = reinterpret_cast<const uint4*>(entering) + ((size_t)bh * gridDim.x + c) * (DV / 8) * (DK / 16) * 32;
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint4 x = sc[((size_t)(col0 / 8 + nt) * (DK / 16) + kk) * 32 + lane];
      sala_mma(o[nt], qa[kk], x.x, x.y, __nv_bfloat16());
      sala_mma(o[nt], qa[kk], x.z, x.w, __nv_bfloat16());
    }
  const int i0 = 16 * w + g;
  const float d0 = expf(-slope * (i0 + 1)), d1 = expf(-slope * (i0 + 9));
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    o[nt][0] *= d0;
    o[nt][1] *= d0;
    o[nt][2] *= d1;
    o[nt][3] *= d1;
  }

  // (q_i·k_j) γ^{i−j} for j ≤ i, then times V.
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  float s[8][4];
  sala_score_tiles<__nv_bfloat16, DK, 8>(s, qa, ks, 0, lane);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + 8 * (e >> 1), j = 8 * nt + 2 * t + (e & 1);
      s[nt][e] = j <= i ? s[nt][e] * expf(-slope * (i - j)) : 0.f;
    }
  const int mi = lane >> 3, mj = lane & 7;
#pragma unroll
  for (int kk = 0; kk < C / 16; ++kk) {
    if (kk > w) break;  // keys past the warp's last query
    uint32_t phi[4], plo[4];
    sala_split_pair(s[2 * kk][0], s[2 * kk][1], phi[0], plo[0]);
    sala_split_pair(s[2 * kk][2], s[2 * kk][3], phi[1], plo[1]);
    sala_split_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], phi[2], plo[2]);
    sala_split_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], phi[3], plo[3]);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b[4];
      sala_ldmatrix_x4_trans(b, vs + (16 * kk + 8 * (mi & 1) + mj) * VS + 8 * n + 8 * (mi >> 1));
      sala_mma(o[n], phi, b[0], b[1], __nv_bfloat16());
      sala_mma(o[n], plo, b[0], b[1], __nv_bfloat16());
      sala_mma(o[n + 1], phi, b[2], b[3], __nv_bfloat16());
      sala_mma(o[n + 1], plo, b[2], b[3], __nv_bfloat16());
    }
  }

  const float scale = __int_as_float(SCALE_BITS);
  const int b = bh / heads, h = bh % heads;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int tok = row0 + i0 + 8 * half;
    if (tok >= t_len) continue;
    __nv_bfloat16* row = out + (((size_t)b * t_len + tok) * heads + h) * DV + col0 + 2 * t;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<uint32_t*>(row + 8 * nt) = sala_pack(o[nt][2 * half] * scale, o[nt][2 * half + 1] * scale, __nv_bfloat16());
  }
}
