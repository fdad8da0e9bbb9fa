// InfLLM-V2 stage 1 for bf16 queries on tensor cores (CUDA, sm_80 and later): the window scores
// of sala_select_window_scores (select_blocks.cu) straight from the pooled keys, without the
// float32 score matrices q·c1ᵀ and q·c2ᵀ (at 512K tokens 16 × 2048 × 32K floats per KV head and
// prefill chunk, written and read back; at decode two matrix products per layer and step). Two
// kernels, then sala_select_topk:
//   sala_select_lse_mma      the level-2 log-sum-exp of each query head, as a partial (max, sum, log2 units)
//                            per range of windows (blockIdx.x of gridDim.x ranges);
//   sala_select_windows_mma  merges the partials and writes Σ_g exp(score − lse_g) for its range
//                            of level-1 windows (blockIdx.x), zero where not visible.
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_select_*_mma need mma.sync for bf16 and cp.async (compute capability 8.0 or later)"
#endif

#define SALA_SEL_TILE 64
#define SALA_LOG2E 1.4426950408889634f

// Whether keys of type K are staged as hi + lo (float32) or as they are (bf16).
template <typename K> struct sala_split_keys { static constexpr bool value = false; };
template <> struct sala_split_keys<float> { static constexpr bool value = true; };

// Tiles [first, last) of keys c (n windows of D, `stride` elements apart) through the two tile
// buffers of `smem`, in order; score(hi, lo, w0) is called for each by every thread of the block (it may synchronise).
// bf16: tile i + 1 is copied while tile i is scored.
template <int D, int THREADS, typename F>
__device__ inline void sala_stream_tiles(__nv_bfloat16* smem, const __nv_bfloat16* c, size_t stride, int n, int first, int last, F&& score) {
  constexpr int CS = D + 8, CHUNKS = SALA_SEL_TILE * D / 8;  // 16-byte pieces per tile
  static_assert(CHUNKS % THREADS == 0, "whole pieces per thread");
  auto issue = [&](int tile) {
    __nv_bfloat16* buf = smem + ((tile - first) & 1) * SALA_SEL_TILE * CS;
    const int w0 = tile * SALA_SEL_TILE;
#pragma unroll 1  // the copies do not wait: unrolling would only hold more addresses in registers
    for (int i = 0; i < CHUNKS / THREADS; ++i) {
      const int e = i * THREADS + threadIdx.x, j = e / (D / 8), col = (e % (D / 8)) * 8;
      const bool ok = w0 + j < n;
      sala_cp_async16(buf + j * CS + col, ok ? c + (w0 + j) * stride + col : c, ok);
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
    __syncthreads();
    score(smem + ((tile - first) & 1) * SALA_SEL_TILE * CS, (const __nv_bfloat16*)nullptr, tile * SALA_SEL_TILE);
    __syncthreads();  // the buffer is free for tile + 2
  }
}

template <int D, int THREADS, typename F>
__device__ inline void sala_stream_tiles(__nv_bfloat16* smem, const float* c, size_t stride, int n, int first, int last, F&& score) {
  constexpr int CS = D + 8, CHUNKS = SALA_SEL_TILE * D / 4;  // float4 pieces per tile
  static_assert(CHUNKS % THREADS == 0, "whole pieces per thread");
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

// Tiles of this thread block's range (blockIdx.x of gridDim.x) among `tiles` in all.
__device__ inline void sala_tile_range(int tiles, int& first, int& last) {
  const int per = (tiles + gridDim.x - 1) / gridDim.x;
  first = min(tiles, (int)blockIdx.x * per);
  last = min(tiles, first + per);
}

template <typename K, int D, int G, int KERNEL2, int STRIDE2, int SCALE_BITS, int QPB>
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
  sala_stream_tiles<D, 32 * QPB>(tiles, c2 + (size_t)h * D, (size_t)gridDim.z * D, n2, first, last,
                                  [&](const __nv_bfloat16* hi, const __nv_bfloat16* lo, int w0) {
    if (w0 >= n2v) return;
    float s[SALA_SEL_TILE / 8][4];
    sala_tile_scores<D, sala_split_keys<K>::value>(s, qa, hi, lo, lane);
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
      l[i] = m[i] == -INFINITY ? 0.f : l[i] * exp2f(m[i] - new_m);
      m[i] = new_m;
    }
#pragma unroll
    for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) l[e >> 1] += s[nt][e] == -INFINITY ? 0.f : exp2f(s[nt][e] - m[e >> 1]);
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

template <typename R, typename K, int D, int G, int KERNEL, int STRIDE, int SCALE_BITS, int QPB>
__device__ void sala_select_windows_mma(
    const __nv_bfloat16* q,   // [Hq, Tq, D]
    const K* c1,              // [n1, Hkv, D] level-1 pooled keys
    const float* partial,     // [Hkv, Tq, ranges, 2, 16] from sala_select_lse_mma
    int first_pos,            // position of query 0
    float* window_scores,     // [Hkv, Tq, n1]
    int Tq, int n1, int ranges) {
  static_assert(G <= 16 && D % 32 == 0, "one 16-row tile of heads");
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
  float* ws = window_scores + ((size_t)h * Tq + t) * n1;

  // Σ_g exp(scale · q_g·c1[w] − lse_g) for visible windows; tiles no query of the block sees
  // are zeros without staging.
  sala_stream_tiles<D, 32 * QPB>(tiles, c1 + (size_t)h * D, (size_t)gridDim.z * D, n1, first, min(last, max(first, staged)),
                                  [&](const __nv_bfloat16* hi, const __nv_bfloat16* lo, int w0) {
    // v[2nt + j]: this lane's sum over its two rows for window 8nt + 2c + j.
    float v[SALA_SEL_TILE / 4];
#pragma unroll
    for (int j = 0; j < SALA_SEL_TILE / 4; ++j) v[j] = 0.f;
    if (w0 < n1v && any) {
      float s[SALA_SEL_TILE / 8][4];
      sala_tile_scores<D, sala_split_keys<K>::value>(s, qa, hi, lo, lane);
#pragma unroll
      for (int nt = 0; nt < SALA_SEL_TILE / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int w = w0 + 8 * nt + 2 * c + (e & 1), row = r + 8 * (e >> 1);
          v[2 * nt + (e & 1)] += (w < n1v && row < G) ? exp2f(fmaf(s[nt][e], scale, -lse[e >> 1])) : 0.f;
        }
      }
    }
    // Each window's sum over the 8 lanes of its column pair (rows r = lane >> 2), as a
    // reduce-scatter: each step halves the values a lane carries, 14 shuffles where summing every
    // value over all 8 lanes took 48. Lane (r, c) ends with windows 8r + 2c and 8r + 2c + 1, so
    // every lane writes two.
    sala_sum_halves<SALA_SEL_TILE / 8, 16>(v, lane);
    sala_sum_halves<SALA_SEL_TILE / 16, 8>(v, lane);
    sala_sum_halves<SALA_SEL_TILE / 32, 4>(v, lane);
    if (active) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int w = w0 + 8 * r + 2 * c + e;
        if (w < n1) ws[w] = static_cast<float>(static_cast<R>(v[e]));
      }
    }
  });
  if (!active) return;
  for (int w = max(first, staged) * SALA_SEL_TILE + lane; w < min(n1, last * SALA_SEL_TILE); w += 32) ws[w] = 0.f;
}
