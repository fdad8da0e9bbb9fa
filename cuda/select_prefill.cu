// InfLLM-V2 stage 1 for many half-precision queries on tensor cores (CUDA, sm_80 and later): the
// window scores of sala_select_window_scores (select_blocks.cu) without the float32 score
// matrices q·c1ᵀ and q·c2ᵀ, which at long context cost more than everything else in a prefill
// chunk (16 × 2048 × 32K floats per KV head at 512K tokens, written and read back).
//
// Thread block = QPB consecutive queries of KV head h, one warp each; a warp's 16 mma rows are the
// query's G ≤ 16 heads. Pass 1 streams the level-2 pooled keys in 64-window tiles through shared
// memory and keeps an online log-sum-exp per head; pass 2 streams the level-1 keys and sums
// exp(score − lse) over the heads for every visible window. The pooled keys are float32: each is
// staged as two bf16 values c = hi + lo (16 significant bits), and each product is q·hi + q·lo on
// bf16 tensor cores with float32 accumulation (q is bf16 already), so the scores carry about
// 2⁻¹⁷ relative error instead of bf16's 2⁻⁹. Uses sala_mma / sala_ldmatrix_x4 from
// block_sparse_prefill.cu.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_select_windows_mma needs mma.sync for bf16 (compute capability 8.0 or later)"
#endif

#define SALA_SEL_TILE 64

// Windows w0 .. w0 + 63 of one KV head's pooled keys into shared memory as hi and lo bf16 tiles
// (zeros past n); rows padded by 8 elements so that ldmatrix reads without bank conflicts.
template <int D>
__device__ inline void sala_stage_windows(__nv_bfloat16* hi, __nv_bfloat16* lo, const float* c, int w0, int n) {
  constexpr int CS = D + 8;
  for (int e = threadIdx.x; e < SALA_SEL_TILE * D / 4; e += blockDim.x) {
    const int j = e / (D / 4), col = (e % (D / 4)) * 4;
    const float4 x = w0 + j < n ? *reinterpret_cast<const float4*>(c + (size_t)(w0 + j) * D + col) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
      hi[j * CS + col + i] = h;
      lo[j * CS + col + i] = __float2bfloat16_rn(v[i] - __bfloat162float(h));
    }
  }
}

// Unscaled scores of the staged tile's 64 windows for the warp's 16 rows: s[nt] is the mma tile
// of windows 8nt .. 8nt + 7. One ldmatrix gives b0, b1 of two k steps (columns 16kk .. 16kk + 31).
template <int D>
__device__ inline void sala_tile_scores(float (&s)[SALA_SEL_TILE / 8][4], const uint32_t (&qa)[D / 16][4],
                                        const __nv_bfloat16* hi, const __nv_bfloat16* lo, int lane) {
  constexpr int CS = D + 8;
  const int mi = lane >> 3, mj = lane & 7;
#pragma unroll
  for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      const int at = (8 * nt + mj) * CS + 16 * kk + 8 * mi;
      uint32_t b[4];
      sala_ldmatrix_x4(b, hi + at);
      sala_mma(s[nt], qa[kk], b[0], b[1], __nv_bfloat16());
      sala_mma(s[nt], qa[kk + 1], b[2], b[3], __nv_bfloat16());
      sala_ldmatrix_x4(b, lo + at);
      sala_mma(s[nt], qa[kk], b[0], b[1], __nv_bfloat16());
      sala_mma(s[nt], qa[kk + 1], b[2], b[3], __nv_bfloat16());
    }
  }
}

template <typename R, int D, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2, int SCALE_BITS, int QPB>
__device__ void sala_select_windows_mma(
    const __nv_bfloat16* q,   // [Hq, Tq, D]
    const float* c1,          // [Hkv, n1, D] level-1 pooled keys
    const float* c2,          // [Hkv, n2, D] level-2 pooled keys
    int first_pos,            // position of query 0
    float* window_scores,     // [Hkv, Tq, n1]
    int Tq, int n1, int n2) {
  static_assert(G <= 16 && D % 32 == 0, "one 16-row tile of heads");
  __shared__ __align__(16) __nv_bfloat16 hi[SALA_SEL_TILE * (D + 8)];
  __shared__ __align__(16) __nv_bfloat16 lo[SALA_SEL_TILE * (D + 8)];
  const int h = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, c = lane & 3;
  const int t = blockIdx.y * QPB + warp;
  const bool active = t < Tq;
  const int pos = first_pos + t;
  const int last_pos = first_pos + min(Tq - 1, (int)blockIdx.y * QPB + QPB - 1);
  const float scale = __int_as_float(SCALE_BITS);

  // Q as A fragments, one per 16 columns: rows r and r + 8 are heads h·G + r (+ 8), zero past G.
  uint32_t qa[D / 16][4];
  {
    const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
    const bool lo_row = active && r < G, hi_row = active && r + 8 < G;
    const size_t row_lo = ((size_t)(h * G + r) * Tq + t) * D, row_hi = ((size_t)(h * G + r + 8) * Tq + t) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int col = 16 * kk + 2 * c;
      qa[kk][0] = lo_row ? q32[(row_lo + col) / 2] : 0u;
      qa[kk][1] = hi_row ? q32[(row_hi + col) / 2] : 0u;
      qa[kk][2] = lo_row ? q32[(row_lo + col + 8) / 2] : 0u;
      qa[kk][3] = hi_row ? q32[(row_hi + col + 8) / 2] : 0u;
    }
  }
  const int n2v = active ? sala_visible(pos, KERNEL2, STRIDE2, n2) : 0;
  const int n1v = active ? sala_visible(pos, KERNEL, STRIDE, n1) : 0;
  const int n2_block = sala_visible(last_pos, KERNEL2, STRIDE2, n2);
  const int n1_block = sala_visible(last_pos, KERNEL, STRIDE, n1);

  // Pass 1: log-sum-exp of the scaled level-2 scores per head (rows r, r + 8).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float* c2h = c2 + (size_t)h * n2 * D;
  for (int w0 = 0; w0 < n2_block; w0 += SALA_SEL_TILE) {
    __syncthreads();
    sala_stage_windows<D>(hi, lo, c2h, w0, n2);
    __syncthreads();
    if (w0 >= n2v) continue;
    float s[SALA_SEL_TILE / 8][4];
    sala_tile_scores<D>(s, qa, hi, lo, lane);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int w = w0 + 8 * nt + 2 * c + (e & 1);
        s[nt][e] = w < n2v ? s[nt][e] * scale : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float new_m = fmaxf(m[i], mx[i]);
      l[i] = m[i] == -INFINITY ? 0.f : l[i] * expf(m[i] - new_m);
      m[i] = new_m;
    }
#pragma unroll
    for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) l[e >> 1] += s[nt][e] == -INFINITY ? 0.f : expf(s[nt][e] - m[e >> 1]);
    }
  }
  float lse[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    lse[i] = l[i] > 0.f ? m[i] + logf(l[i]) : -INFINITY;
  }

  // Pass 2: window scores Σ_g exp(scale · q_g·c1[w] − lse_g) for visible windows, else 0.
  float* ws = window_scores + ((size_t)h * Tq + t) * n1;
  const float* c1h = c1 + (size_t)h * n1 * D;
  for (int w0 = 0; w0 < n1; w0 += SALA_SEL_TILE) {
    float col[SALA_SEL_TILE / 8][2];
#pragma unroll
    for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) col[nt][0] = col[nt][1] = 0.f;
    if (w0 < n1_block) {  // the same in the whole thread block
      __syncthreads();
      sala_stage_windows<D>(hi, lo, c1h, w0, n1);
      __syncthreads();
      if (w0 < n1v && n2v > 0) {
        float s[SALA_SEL_TILE / 8][4];
        sala_tile_scores<D>(s, qa, hi, lo, lane);
#pragma unroll
        for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int w = w0 + 8 * nt + 2 * c + (e & 1), row = r + 8 * (e >> 1);
            col[nt][e & 1] += (w < n1v && row < G) ? expf(s[nt][e] * scale - lse[e >> 1]) : 0.f;
          }
        }
#pragma unroll
        for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) col[nt][e] += __shfl_xor_sync(0xffffffffu, col[nt][e], o);
          }
        }
      }
    }
    if (active && r == 0) {
#pragma unroll
      for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int w = w0 + 8 * nt + 2 * c + e;
          if (w < n1) ws[w] = static_cast<float>(static_cast<R>(col[nt][e]));
        }
      }
    }
  }
}
