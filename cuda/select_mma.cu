// InfLLM-V2 stage 1 for bf16 queries on tensor cores (CUDA, sm_80 and later): the window scores
// of sala_select_window_scores (select_blocks.cu) straight from the pooled keys, without the
// float32 score matrices q·c1ᵀ and q·c2ᵀ (at 512K tokens 16 × 2048 × 32K floats per KV head and
// prefill chunk, written and read back; at decode two matrix products per layer and step). Two
// kernels, then sala_select_topk:
//   sala_select_lse_mma      the level-2 log-sum-exp of each query head, as a partial (max, sum, log2 units)
//                            per range of windows (blockIdx.x of gridDim.x ranges);
//   sala_select_windows_mma  merges the partials and scores Σ_g exp(score − lse_g) for its range
//                            of level-1 windows (blockIdx.x), zero where not visible, and writes
//                            them as pooling reads them: the most and the last window of each
//                            block's group (SalaWindowMaxima, select_blocks.cu).
// Thread block = QPB consecutive queries of KV head blockIdx.z (blockIdx.y), one warp each; a
// warp's 16 mma rows are the query's G ≤ 16 heads. Prefill gives a thread block many queries and
// all windows; decode one query and a few 64-window tiles, so that many blocks share the work.
//
// The pooled keys are window-major, [n, Hkv, D] (as the cache stores them, read in place), and
// stream through shared memory in 64-window tiles. bf16 keys (the model's dtype;
// the reference stores them so) are copied asynchronously, the next tile while the current one is
// scored, and scored with one product (float32 accumulation, as the reference's kernel).
// float32 keys are staged as two bf16 values c = hi + lo (16 significant bits) and scored with
// q·hi + q·lo, about 2⁻¹⁷ relative error. Uses the helpers of mma.cu and sala_load_query_heads
// from block_sparse_prefill.cu.
// On Hopper (WGMMA) a thread block's warps form warpgroups of four queries (64 mma rows) that score
// a bf16 tile with wgmma straight from shared memory (wgmma.cu): the tile is read once a
// warpgroup instead of once a warp through ldmatrix.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_select_*_mma need mma.sync for bf16 and cp.async (compute capability 8.0 or later)"
#endif

#define SALA_SEL_TILE 64
#define SALA_LOG2E 1.4426950408889634f

// Whether keys of type K are staged as hi + lo (float32) or as they are (bf16).
template <typename K> struct sala_split_keys { static constexpr bool value = false; };
template <> struct sala_split_keys<float> { static constexpr bool value = true; };

// Tiles [first, last) of keys c (n windows of D, `stride` elements apart) through the two tile
// buffers of `smem` (2 · SALA_SEL_TILE · (D + 8) elements), in order; score(hi, lo, w0) is called
// for each by every thread of the block (it may synchronise). bf16: tile i + 1 is copied while
// tile i is scored. A tile's rows are padded to D + 8 for ldmatrix, or for wgmma (WGMMA) laid out
// as its 128-byte swizzle reads a K-major operand: D / 64 parts of 64 rows by 128 bytes, row j's
// 16-byte chunk i at chunk i ^ (j mod 8), on 1024-byte boundaries.
template <int D, int THREADS, bool WGMMA, typename F>
__device__ inline void sala_stream_tiles(__nv_bfloat16* smem, const __nv_bfloat16* c, size_t stride, int n, int first, int last, F&& score) {
  constexpr int CS = D + 8, CHUNKS = SALA_SEL_TILE * D / 8;  // 16-byte pieces per tile
  constexpr int TILE = WGMMA ? SALA_SEL_TILE * D : SALA_SEL_TILE * CS;
  static_assert(CHUNKS % THREADS == 0, "whole pieces per thread");
  static_assert(!WGMMA || D % 64 == 0, "whole 128-byte rows");
  if constexpr (WGMMA) smem += ((1024u - (sala_shared_address(smem) & 1023u)) & 1023u) / sizeof(__nv_bfloat16);
  auto issue = [&](int tile) {
    __nv_bfloat16* buf = smem + ((tile - first) & 1) * TILE;
    const int w0 = tile * SALA_SEL_TILE;
#pragma unroll 1  // the copies do not wait: unrolling would only hold more addresses in registers
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
      const int e = i * THREADS + threadIdx.x, j = e / (D / 8), col = (e % (D / 8)) * 8;
      const bool ok = w0 + j < n;
      __nv_bfloat16* dst = WGMMA ? buf + (col / 64) * SALA_SEL_TILE * 64 + j * 64 + ((((col % 64) / 8) ^ (j & 7)) * 8) : buf + j * CS + col;
      sala_cp_async16(dst, ok ? c + (w0 + j) * stride + col : c, ok);
    }
    asm volatile("cp.async.commit_group;");
  };
  if (first < last) issue(first);
  for (int tile = first; tile < last; ++tile) {
    if (tile + 1 < last) {
      issue(tile + 1);
      asm volatile("cp.async.wait_group 1;");
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    // This thread's copies, made by the generic proxy, become visible to wgmma's async proxy.
    if constexpr (WGMMA) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    score(smem + ((tile - first) & 1) * TILE, (const __nv_bfloat16*)nullptr, tile * SALA_SEL_TILE);
    __syncthreads();  // the buffer is free for tile + 2
  }
}

template <int D, int THREADS, bool WGMMA, typename F>
__device__ inline void sala_stream_tiles(__nv_bfloat16* smem, const float* c, size_t stride, int n, int first, int last, F&& score) {
  constexpr int CS = D + 8, CHUNKS = SALA_SEL_TILE * D / 4;  // float4 pieces per tile
  static_assert(CHUNKS % THREADS == 0, "whole pieces per thread");
  static_assert(!WGMMA, "float32 keys are scored with mma.sync");
  __nv_bfloat16 *hi = smem, *lo = smem + SALA_SEL_TILE * CS;
  for (int tile = first; tile < last; ++tile) {
    const int w0 = tile * SALA_SEL_TILE;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
      const int e = i * THREADS + threadIdx.x, j = e / (D / 4), col = (e % (D / 4)) * 4;
      const float4 x = w0 + j < n ? *reinterpret_cast<const float4*>(c + (w0 + j) * stride + col) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v[k]);
        hi[j * CS + col + k] = h;
        lo[j * CS + col + k] = __float2bfloat16_rn(v[k] - __bfloat162float(h));
      }
    }
    __syncthreads();
    score(hi, lo, w0);
  }
}

// Unscaled scores of a staged tile's 64 windows for the warp's 16 rows: s[nt] is the mma tile
// of windows 8nt .. 8nt + 7. One ldmatrix gives b0, b1 of two k steps (columns 16kk .. 16kk + 31).
template <int D, bool SPLIT>
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
      if constexpr (SPLIT) {
        sala_ldmatrix_x4(b, lo + at);
        sala_mma(s[nt], qa[kk], b[0], b[1], __nv_bfloat16());
        sala_mma(s[nt], qa[kk + 1], b[2], b[3], __nv_bfloat16());
      }
    }
  }
}

// sala_tile_scores by the warpgroup's wgmma from a tile staged for it (sala_stream_tiles): every
// warp of the warpgroup calls it, each with its own query's rows.
template <int D>
__device__ inline void sala_tile_scores_wgmma(float (&s)[SALA_SEL_TILE / 8][4], const uint32_t (&qa)[D / 16][4], const __nv_bfloat16* tile) {
  static_assert(SALA_SEL_TILE == 64, "one m64n64 product a k step");
  const uint32_t base = sala_shared_address(tile);
#pragma unroll
  for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  sala_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    sala_wgmma_bf16_n64(s, qa[kk], sala_wgmma_descriptor(base + (kk / 4) * SALA_SEL_TILE * 128 + 32 * (kk % 4)), kk > 0);
  sala_wgmma_commit();
  sala_wgmma_wait<0>(s);
}

template <typename K, int D, bool WGMMA>
__device__ __forceinline__ void sala_score_tile(float (&s)[SALA_SEL_TILE / 8][4], const uint32_t (&qa)[D / 16][4], const __nv_bfloat16* hi,
                                                const __nv_bfloat16* lo, int lane) {
  if constexpr (WGMMA) sala_tile_scores_wgmma<D>(s, qa, hi);
  else sala_tile_scores<D, sala_split_keys<K>::value>(s, qa, hi, lo, lane);
}

// The tile's scores (windows from w0 on) in log2 units; with MASKED −inf from window `visible` on.
template <bool MASKED>
__device__ __forceinline__ void sala_scale_scores(float (&s)[SALA_SEL_TILE / 8][4], float scale, int w0, int visible, int lane) {
#pragma unroll
  for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int w = w0 + 8 * nt + 2 * (lane & 3) + (e & 1);
      s[nt][e] = (!MASKED || w < visible) ? s[nt][e] * scale : -INFINITY;
    }
  }
}

// v[2nt + j] += this lane's two rows' exp2(score − lse) for window 8nt + 2 (lane % 4) + j of the
// tile (s unscaled); with MASKED only for windows before `visible` and rows below G.
template <int G, bool MASKED>
__device__ __forceinline__ void sala_add_window_terms(float (&v)[SALA_SEL_TILE / 4], const float (&s)[SALA_SEL_TILE / 8][4], float scale,
                                                      const float (&lse)[2], int w0, int visible, int lane) {
  const int r = lane >> 2, c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int w = w0 + 8 * nt + 2 * c + (e & 1), row = r + 8 * (e >> 1);
      if (!MASKED || (w < visible && row < G)) v[2 * nt + (e & 1)] += exp2f(fmaf(s[nt][e], scale, -lse[e >> 1]));
    }
  }
}

// Lanes APART · j apart (j < COUNT) hold consecutive parts of one group of windows, each the most
// of its part and its last window: the group's most and last window in every lane of the group.
template <int COUNT, int APART>
__device__ __forceinline__ void sala_group_most(float& most, float& last, int lane) {
#pragma unroll
  for (int o = APART; o < APART * COUNT; o <<= 1) most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, o));
  last = __shfl_sync(0xffffffffu, last, lane | (APART * (COUNT - 1)));
}

// A window's score as pooling compares it: rounded to R, −inf past the n1 windows.
template <typename R>
__device__ __forceinline__ float sala_rounded_window(float v, int w, int n1) {
  return w < n1 ? static_cast<float>(static_cast<R>(v)) : -INFINITY;
}

// Window maxima (SalaWindowMaxima) of one query's windows w0 .. w1 (w0 a group's first), which no
// thread block staged (no query of it sees them: scores 0), a lane taking every 32nd group.
template <typename R, int RPB>
__device__ void sala_unseen_maxima(R* m, int w0, int w1, int n1, int lane) {
  for (int g = w0 / RPB + lane; g < (w1 + RPB - 1) / RPB; g += 32) {
    m[2 * g] = static_cast<R>(0.f);
    m[2 * g + 1] = static_cast<R>(RPB * g + RPB - 1 < n1 ? 0.f : -INFINITY);
  }
}

// Tiles of this thread block's range (blockIdx.x of gridDim.x) among `tiles` in all.
__device__ inline void sala_tile_range(int tiles, int& first, int& last) {
  const int per = (tiles + gridDim.x - 1) / gridDim.x;
  first = min(tiles, (int)blockIdx.x * per);
  last = min(tiles, first + per);
}

template <typename K, int D, int G, int KERNEL2, int STRIDE2, int SCALE_BITS, int QPB, bool WGMMA>
__device__ void sala_select_lse_mma(
    const __nv_bfloat16* q,   // [Hq, Tq, D]
    const K* c2,              // [n2, Hkv, D] level-2 pooled keys
    int first_pos,            // position of query 0
    float* partial,           // [Hkv, Tq, ranges, 2, 16]: (max, sum) of each head row, log2 units
    int Tq, int n2) {
  static_assert(G <= 16 && D % 32 == 0, "one 16-row tile of heads");
  __shared__ __align__(16) __nv_bfloat16 tiles[2 * SALA_SEL_TILE * (D + 8)];
  const int h = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, c = lane & 3;
  const int t = blockIdx.y * QPB + warp;
  const bool active = t < Tq;
  const int last_pos = first_pos + min(Tq - 1, (int)blockIdx.y * QPB + QPB - 1);
  // Scores in log2 units: exp2f is one MUFU instruction where expf takes several.
  const float scale = __int_as_float(SCALE_BITS) * SALA_LOG2E;
  uint32_t qa[D / 16][4];
  sala_load_query_heads<D, G>(qa, q, h, t, Tq, active, lane);
  const int n2v = active ? sala_visible(first_pos + t, KERNEL2, STRIDE2, n2) : 0;
  int first, last;
  sala_tile_range((sala_visible(last_pos, KERNEL2, STRIDE2, n2) + SALA_SEL_TILE - 1) / SALA_SEL_TILE, first, last);

  // Online max and sum of exp over the range (rows r, r + 8); the sum per lane until the end.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  sala_stream_tiles<D, 32 * QPB, WGMMA>(tiles, c2 + (size_t)h * D, (size_t)gridDim.z * D, n2, first, last,
                                         [&](const __nv_bfloat16* hi, const __nv_bfloat16* lo, int w0) {
    // A warpgroup's wgmma takes all four of its warps, whichever windows their queries see.
    if (!WGMMA && w0 >= n2v) return;
    float s[SALA_SEL_TILE / 8][4];
    sala_score_tile<K, D, WGMMA>(s, qa, hi, lo, lane);
    if (w0 >= n2v) return;
    if (w0 + SALA_SEL_TILE <= n2v) sala_scale_scores<false>(s, scale, w0, n2v, lane);
    else sala_scale_scores<true>(s, scale, w0, n2v, lane);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float new_m = fmaxf(m[i], mx[i]);
      l[i] = m[i] == -INFINITY ? 0.f : l[i] * exp2f(m[i] - new_m);
      m[i] = new_m;
    }
    // m is finite: window w0 is visible, and rows past G score 0. exp2f(−inf) is 0.
#pragma unroll
    for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) l[e >> 1] += exp2f(s[nt][e] - m[e >> 1]);
    }
  });
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  if (active && c == 0) {
    float* p = partial + (((size_t)h * Tq + t) * gridDim.x + blockIdx.x) * 32;
    p[r] = m[0];
    p[r + 8] = m[1];
    p[16 + r] = l[0];
    p[16 + r + 8] = l[1];
  }
}

// One step of a reduce-scatter between lanes O apart: of v[0, 2·HALF) a lane keeps the upper
// half where its lane bit O is set, else the lower, plus its partner's values of that half, in
// v[0, HALF).
template <int HALF, int O>
__device__ __forceinline__ void sala_sum_halves(float* v, int lane) {
  const bool upper = lane & O;
#pragma unroll
  for (int j = 0; j < HALF; ++j) {
    const float sent = upper ? v[j] : v[j + HALF];
    v[j] = (upper ? v[j + HALF] : v[j]) + __shfl_xor_sync(0xffffffffu, sent, O);
  }
}

template <typename R, typename K, int D, int G, int KERNEL, int STRIDE, int BLOCK, int SCALE_BITS, int QPB>
__device__ void sala_select_windows_mma(
    const __nv_bfloat16* q,   // [Hq, Tq, D]
    const K* c1,              // [n1, Hkv, D] level-1 pooled keys
    const float* partial,     // [Hkv, Tq, ranges, 2, 16] from sala_select_lse_mma
    int first_pos,            // position of query 0
    R* maxima,                // [Hkv, Tq, groups, 2] window maxima (SalaWindowMaxima)
    int Tq, int n1, int ranges) {
  static_assert(G <= 16 && D % 32 == 0, "one 16-row tile of heads");
  constexpr int RPB = BLOCK / STRIDE;  // windows a group
  static_assert(RPB == 2 || RPB == 4 || RPB == 8, "a group within a lane quad");
  __shared__ __align__(16) __nv_bfloat16 tiles[2 * SALA_SEL_TILE * (D + 8)];
  const int h = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, c = lane & 3;
  const int t = blockIdx.y * QPB + warp;
  const bool active = t < Tq;
  const int last_pos = first_pos + min(Tq - 1, (int)blockIdx.y * QPB + QPB - 1);
  const float scale = __int_as_float(SCALE_BITS) * SALA_LOG2E;  // log2 units, as the partials
  uint32_t qa[D / 16][4];
  sala_load_query_heads<D, G>(qa, q, h, t, Tq, active, lane);

  // lse of rows r, r + 8 from the partials of all ranges; −inf when no level-2 window is visible
  // (the same for every row of a query). Lane j merges row j % 16 over every other range, the
  // two halves meet by a shuffle (one lane walking all ranges for its rows had waited on one
  // load after another: at decode 32 ranges took most of the kernel's time).
  float lse[2] = {-INFINITY, -INFINITY};
  if (active) {
    const float* p = partial + ((size_t)h * Tq + t) * ranges * 32 + (lane & 15);
    float mm = -INFINITY, ll = 0.f;
#pragma unroll 8
    for (int s = lane >> 4; s < ranges; s += 2) mm = fmaxf(mm, p[32 * s]);
    mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, 16));
#pragma unroll 8
    for (int s = lane >> 4; s < ranges; s += 2) {
      const float ms = p[32 * s];
      if (ms != -INFINITY) ll += p[32 * s + 16] * exp2f(ms - mm);
    }
    ll += __shfl_xor_sync(0xffffffffu, ll, 16);
    const float row_lse = ll > 0.f ? mm + log2f(ll) : -INFINITY;
    lse[0] = __shfl_sync(0xffffffffu, row_lse, r);
    lse[1] = __shfl_sync(0xffffffffu, row_lse, r + 8);
  }
  const bool any = lse[0] != -INFINITY;
  const int n1v = active ? sala_visible(first_pos + t, KERNEL, STRIDE, n1) : 0;
  const int staged = (sala_visible(last_pos, KERNEL, STRIDE, n1) + SALA_SEL_TILE - 1) / SALA_SEL_TILE;
  int first, last;
  sala_tile_range((n1 + SALA_SEL_TILE - 1) / SALA_SEL_TILE, first, last);
  const int groups = (n1 + RPB - 1) / RPB;
  R* mq = maxima + ((size_t)h * Tq + t) * groups * 2;

  // Σ_g exp(scale · q_g·c1[w] − lse_g) for visible windows; tiles no query of the block sees
  // are zeros without staging.
  sala_stream_tiles<D, 32 * QPB, false>(tiles, c1 + (size_t)h * D, (size_t)gridDim.z * D, n1, first, min(last, max(first, staged)),
                                         [&](const __nv_bfloat16* hi, const __nv_bfloat16* lo, int w0) {
    // v[2nt + j]: this lane's sum over its two rows for window 8nt + 2c + j.
    float v[SALA_SEL_TILE / 4];
#pragma unroll
    for (int j = 0; j < SALA_SEL_TILE / 4; ++j) v[j] = 0.f;
    if (w0 < n1v && any) {
      float s[SALA_SEL_TILE / 8][4];
      sala_tile_scores<D, sala_split_keys<K>::value>(s, qa, hi, lo, lane);
      if (G == 16 && w0 + SALA_SEL_TILE <= n1v) sala_add_window_terms<G, false>(v, s, scale, lse, w0, n1v, lane);
      else sala_add_window_terms<G, true>(v, s, scale, lse, w0, n1v, lane);
    }
    // Each window's sum over the 8 lanes of its column pair (rows r = lane >> 2), as a
    // reduce-scatter: each step halves the values a lane carries, 14 shuffles where summing every
    // value over all 8 lanes took 48. Lane (r, c) ends with windows 8r + 2c and 8r + 2c + 1; the
    // RPB / 2 lanes of a group meet by shuffles and its first lane writes.
    sala_sum_halves<SALA_SEL_TILE / 8, 16>(v, lane);
    sala_sum_halves<SALA_SEL_TILE / 16, 8>(v, lane);
    sala_sum_halves<SALA_SEL_TILE / 32, 4>(v, lane);
    const int w = w0 + 8 * r + 2 * c;
    float last_window = sala_rounded_window<R>(v[1], w + 1, n1);
    float most = fmaxf(sala_rounded_window<R>(v[0], w, n1), last_window);
    sala_group_most<RPB / 2, 1>(most, last_window, lane);
    if (active && (c & (RPB / 2 - 1)) == 0 && w < n1) {
      mq[2 * (w / RPB)] = static_cast<R>(most);
      mq[2 * (w / RPB) + 1] = static_cast<R>(last_window);
    }
  });
  if (!active) return;
  sala_unseen_maxima<R, RPB>(mq, max(first, staged) * SALA_SEL_TILE, min(n1, last * SALA_SEL_TILE), n1, lane);
}

// sala_select_windows_mma on Hopper for bf16 keys, eight queries a thread block, with the product
// turned over: a warpgroup's wgmma multiplies a staged tile of 64 level-1 windows (A, its rows)
// by its four queries' 16 heads (B, 64 columns, staged once), both from shared memory. A thread
// then holds four heads of each query for two windows, so the sum over heads is in-thread adds
// and two shuffle steps across a quad, where the heads-as-rows form spent a reduce over eight
// lanes on every window. Heads past G and queries that see no level-2 window get lse = +inf
// (terms 0). Dynamic shared memory: two key tiles and two warpgroups' query rows, 64 × D bf16
// each, then the 128 lse, with 1024 bytes to align them to the swizzle's atoms.
template <typename R, int D, int G, int KERNEL, int STRIDE, int BLOCK, int SCALE_BITS>
__device__ void sala_select_windows_wgmma(
    const __nv_bfloat16* q,   // [Hq, Tq, D]
    const __nv_bfloat16* c1,  // [n1, Hkv, D] level-1 pooled keys
    const float* partial,     // [Hkv, Tq, ranges, 2, 16] from sala_select_lse_mma
    int first_pos,            // position of query 0
    R* maxima,                // [Hkv, Tq, groups, 2] window maxima (SalaWindowMaxima)
    int Tq, int n1, int ranges) {
  constexpr int QPB = 8, TILE_BYTES = SALA_SEL_TILE * D * 2, QUERY_BYTES = 64 * D * 2;
  constexpr int RPB = BLOCK / STRIDE;  // windows a group
  static_assert(RPB == 2 || RPB == 4 || RPB == 8, "a group within one half of a warp's 16 windows");
  const int groups = (n1 + RPB - 1) / RPB;
  static_assert(G <= 16 && D % 64 == 0 && D <= 128, "four queries' 16 head rows, whole 128-byte rows");
  extern __shared__ __align__(16) unsigned char sala_dynamic_shared[];
  const uint32_t raw = sala_shared_address(sala_dynamic_shared), aligned = (raw + 1023) & ~1023u;
  unsigned char* const keys = sala_dynamic_shared + (aligned - raw);
  unsigned char* const queries = keys + 2 * TILE_BYTES;
  float* const lse_all = reinterpret_cast<float*>(queries + 2 * QUERY_BYTES);
  const int h = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = (tid >> 5) & 3, group = tid >> 7;
  const int t0 = blockIdx.y * QPB + 4 * group;  // the warpgroup's first query
  const float scale = __int_as_float(SCALE_BITS) * SALA_LOG2E;

  // The queries' head rows (row 16 · query + head), in the swizzled layout sala_stream_tiles gives keys.
#pragma unroll
  for (int i = 0; i < 2 * 64 * D / 8 / 256; ++i) {
    const int e = i * 256 + tid, wg = e / (64 * D / 8), row = (e / (D / 8)) % 64, col = (e % (D / 8)) * 8;
    const int t = blockIdx.y * QPB + 4 * wg + row / 16, g = row % 16;
    const bool ok = g < G && t < Tq;
    sala_cp_async16(queries + wg * QUERY_BYTES + (col / 64) * 64 * 128 + row * 128 + ((((col % 64) / 8) ^ (row & 7)) << 4),
                    ok ? q + ((size_t)(h * G + g) * Tq + t) * D + col : q, ok);
  }
  asm volatile("cp.async.commit_group;");
  // lse of each (query, head) column of both warpgroups from the partials of all ranges.
  if (tid < 128) {
    const int t = blockIdx.y * QPB + tid / 16, g = tid % 16;
    float lse = INFINITY;
    if (g < G && t < Tq) {
      const float* p = partial + ((size_t)h * Tq + t) * ranges * 32 + g;
      float mm = -INFINITY, ll = 0.f;
      for (int r = 0; r < ranges; ++r) mm = fmaxf(mm, p[32 * r]);
      for (int r = 0; r < ranges; ++r)
        if (p[32 * r] != -INFINITY) ll += p[32 * r + 16] * exp2f(p[32 * r] - mm);
      if (ll > 0.f) lse = mm + log2f(ll);
    }
    lse_all[tid] = lse;
  }
  __syncthreads();
  // This thread's columns: 8j + 2 (lane % 4) + e, query j / 2.
  float lse[SALA_SEL_TILE / 8][2];
#pragma unroll
  for (int j = 0; j < SALA_SEL_TILE / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) lse[j][e] = lse_all[64 * group + 8 * j + 2 * (lane & 3) + e];
  int visible[4], fewest = INT_MAX;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    visible[k] = t0 + k < Tq ? sala_visible(first_pos + t0 + k, KERNEL, STRIDE, n1) : 0;
    fewest = min(fewest, visible[k]);
  }
  const int last_pos = first_pos + min(Tq - 1, (int)blockIdx.y * QPB + QPB - 1);
  const int staged = (sala_visible(last_pos, KERNEL, STRIDE, n1) + SALA_SEL_TILE - 1) / SALA_SEL_TILE;
  int first, last;
  sala_tile_range((n1 + SALA_SEL_TILE - 1) / SALA_SEL_TILE, first, last);
  const uint32_t query_tile = aligned + 2 * TILE_BYTES + group * QUERY_BYTES;
  // After the head sums, lane keeps query 2 (lane & 1) + (lane >> 1 & 1), windows lane / 4 (+ 8) of its warp's 16.
  const int own = 2 * (lane & 1) + ((lane >> 1) & 1);

  sala_stream_tiles<D, 256, true>(reinterpret_cast<__nv_bfloat16*>(keys), c1 + (size_t)h * D, (size_t)gridDim.z * D, n1, first,
                                  min(last, max(first, staged)), [&](const __nv_bfloat16* tile, const __nv_bfloat16*, int w0) {
    float s[SALA_SEL_TILE / 8][4];
    const uint32_t key_tile = sala_shared_address(tile);
    sala_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t at = (kk / 4) * 64 * 128 + 32 * (kk % 4);
      sala_wgmma_bf16_n64_ss(s, sala_wgmma_descriptor(key_tile + at), sala_wgmma_descriptor(query_tile + at), kk > 0);
    }
    sala_wgmma_commit();
    sala_wgmma_wait<0>(s);
    // v[2k + half]: query k's sum over this thread's heads, window lane / 4 + 8 · half of the warp's.
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const int w_top = w0 + 16 * warp + (lane >> 2);
    if (w0 + SALA_SEL_TILE <= fewest) {
#pragma unroll
      for (int j = 0; j < SALA_SEL_TILE / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) v[2 * (j >> 1) + (e >> 1)] += exp2f(fmaf(s[j][e], scale, -lse[j][e & 1]));
    } else {
#pragma unroll
      for (int j = 0; j < SALA_SEL_TILE / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (w_top + 8 * (e >> 1) < visible[j >> 1]) v[2 * (j >> 1) + (e >> 1)] += exp2f(fmaf(s[j][e], scale, -lse[j][e & 1]));
    }
    sala_sum_halves<4, 1>(v, lane);
    sala_sum_halves<2, 2>(v, lane);
    // A group's RPB windows are in lanes 4 apart (the same query); its first lane writes.
    R* mq = maxima + ((size_t)h * Tq + t0 + own) * groups * 2;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int w = w_top + 8 * half;
      float most = sala_rounded_window<R>(v[half], w, n1), last_window = most;
      sala_group_most<RPB, 4>(most, last_window, lane);
      if (t0 + own < Tq && ((lane >> 2) & (RPB - 1)) == 0 && w < n1) {
        mq[2 * (w / RPB)] = static_cast<R>(most);
        mq[2 * (w / RPB) + 1] = static_cast<R>(last_window);
      }
    }
  });
  // Windows past every query of the block: zeros, not staged (warp k of the warpgroup, query t0 + k).
  if (t0 + warp >= Tq) return;
  sala_unseen_maxima<R, RPB>(maxima + ((size_t)h * Tq + t0 + warp) * groups * 2, max(first, staged) * SALA_SEL_TILE,
                             min(n1, last * SALA_SEL_TILE), n1, lane);
}
