// InfLLM-V2 block-sparse attention for prefill on tensor cores (bf16/f16 mma.sync, sm_80 and
// later): the same attention as cuda/block_sparse_attention.cu. CUDA only; Metal's prefill uses
// the general kernel. Thread block = QPB consecutive queries of one KV head, one warp each; the
// G ≤ 16 query heads of the group are the 16 rows of the warp's mma tiles. Nearby queries select
// some of the same blocks (the local window, block 0, and on real text much of the top-k), so the
// thread block walks the union of its queries' ascending block lists (64-token blocks): each
// block's keys and values are copied to shared memory once, asynchronously (rows padded by 8
// elements so that ldmatrix reads them without bank conflicts), and every warp whose query
// selected it scores it (Q·Kᵀ, float32 accumulation), keeps its online softmax and adds P·V (P
// rounded to T, as flash attention does). Output in T, [Hq, Tq, D].
// Over a cache of rows (sala_block_sparse_prefill_ring) the union is computed once up front and
// the blocks stream through a ring of tiles in dynamic shared memory, requested STAGES − 1 steps
// ahead, one barrier a step. With PRIVATE, only the blocks two or more queries selected take that
// walk; each warp then streams the blocks its query alone selected through its own share of the
// shared memory, 16 tokens at a time, with no barrier between warps: most top-k blocks are one
// query's, and in the shared walk the other warps would wait through them.
// Over an 8-bit cache (sala_block_sparse_prefill, QGROUP > 0) the walk goes in lockstep, one block
// staged at a time: each thread loads its share of a block's codes, scales and biases into
// registers where the rows would be copied, and writes them dequantized to T into the shared tile
// where the copy would be waited for. Uses mma.cu, the shared steps of
// attention_mma.cu and unpack.cu.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_block_sparse_attention_mma needs mma.sync for bf16/f16 and cp.async (compute capability 8.0 or later)"
#endif

// Query t's G ≤ 16 heads of KV head h from q [Hq, Tq, D] as mma A fragments, one per 16
// columns: rows r and r + 8 of the tile are heads h·G + r (+ 8), zero past G or when inactive.
template <int D, int G, typename T>
__device__ inline void sala_load_query_heads(uint32_t (&qa)[D / 16][4], const T* q, int h, int t, int Tq, bool active, int lane) {
  const int r = lane >> 2, c = lane & 3;
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q);
  const bool lo = active && r < G, hi = active && r + 8 < G;
  const size_t row_lo = ((size_t)(h * G + r) * Tq + t) * D, row_hi = ((size_t)(h * G + r + 8) * Tq + t) * D;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int col = 16 * kk + 2 * c;
    qa[kk][0] = lo ? q32[(row_lo + col) / 2] : 0u;
    qa[kk][1] = hi ? q32[(row_hi + col) / 2] : 0u;
    qa[kk][2] = lo ? q32[(row_lo + col + 8) / 2] : 0u;
    qa[kk][3] = hi ? q32[(row_hi + col + 8) / 2] : 0u;
  }
}

// Scores (log2 units) of NT 8-token tiles of staged keys from position `base` on (a block: eight),
// −inf past the query at `pos` and past the cache.
template <typename T, int D, int NT>
__device__ inline void sala_masked_scores(float (&s)[NT][4], const uint32_t (&qa)[D / 16][4], const T* ks, int base, int pos,
                                          int kv_len, float scale, int lane) {
  sala_score_tiles<T, D>(s, qa, ks, 0, lane);
  const int c = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = base + 8 * nt + 2 * c + (e & 1);
      s[nt][e] = (tok <= pos && tok < kv_len) ? s[nt][e] * scale : -INFINITY;
    }
  }
}

// Query t's attention outputs acc (rows r, r + 8: heads h·G + r (+ 8)) over the per-lane sums l
// into out [Hq, Tq, D].
template <typename T, int D, int G>
__device__ inline void sala_write_query_heads(T* out, const float (&acc)[D / 8][4], float (&l)[2], int h, int t, int Tq, int lane) {
  const int r = lane >> 2, c = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int row = r + 8 * i;
    if (row >= G) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    T* dst = out + ((size_t)(h * G + row) * Tq + t) * D + 2 * c;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      dst[8 * n] = static_cast<T>(acc[n][2 * i] * inv);
      dst[8 * n + 1] = static_cast<T>(acc[n][2 * i + 1] * inv);
    }
  }
}

template <typename T, typename S, int D, int G, int BLOCK, int SCALE_BITS, int QPB, int QGROUP>
__device__ void sala_block_sparse_prefill(
    const T* q,              // [Hq, Tq, D]
    const S* k,              // [Hkv, cap, D]  the cache's history: positions < settled (S = T), or
                             // [Hkv, cap, D / 4] words of codes (S = uint32_t, QGROUP > 0)
    const S* v,              // [Hkv, cap, D]
    const S* kr,             // [Hkv, rcap, D] its recent tokens: positions settled .. kv_len
    const S* vr,             // [Hkv, rcap, D]
    SalaKvScales<T> qsb,     // with codes: their scales and biases
    const int32_t* blocks,   // [Hkv, Tq, nsel], ascending, -1 = none
    int first_pos, int kv_len, int settled,
    T* out,                  // [Hq, Tq, D]
    int Tq, int cap, int rcap, int nsel) {
  static_assert(G <= 16 && D % 32 == 0, "one 16-row tile of heads");
  static_assert(BLOCK == SALA_MMA_TILE, "one tile per block");
  constexpr int KS = D + 8;                           // padded row length (elements)
  __shared__ __align__(16) T ks[SALA_MMA_TILE * KS];  // keys of the tile
  __shared__ __align__(16) T vs[SALA_MMA_TILE * KS];  // its values
  __shared__ int wanted[QPB];                         // each warp's next block

  const int h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = blockIdx.y * QPB + warp;
  const bool active = t < Tq;
  const int pos = first_pos + t;
  // exp2 instead of exp: scores in log2 units.
  const float scale = __int_as_float(SCALE_BITS) * 1.4426950408889634f;

  uint32_t qa[D / 16][4];
  sala_load_query_heads<D, G>(qa, q, h, t, Tq, active, lane);

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows r, r + 8; l per lane until the end

  const int32_t* sel = blocks + ((size_t)h * Tq + (active ? t : 0)) * nsel;
  int cursor = 0;  // the same in every lane of the warp
  constexpr int RS = QGROUP ? D / 4 : D;  // a row's length in S
  const S* kh = k + (size_t)h * cap * RS;
  const S* vh = v + (size_t)h * cap * RS;
  const S* krh = kr + (size_t)h * rcap * RS;
  const S* vrh = vr + (size_t)h * rcap * RS;

  // This warp's next visible block from its cursor (INT_MAX: none).
  auto next_block = [&]() {
    while (active && cursor < nsel) {
      const int b = sel[cursor];
      if (b >= 0 && b * SALA_MMA_TILE <= pos && b * SALA_MMA_TILE < kv_len) return b;
      ++cursor;
    }
    return (int)INT_MAX;
  };
  // The smallest of the warps' next blocks (every thread calls it; `wanted` is written again only
  // after later barriers).
  auto smallest = [&](int mine) {
    if (lane == 0) wanted[warp] = mine;
    __syncthreads();
    int b = INT_MAX;
#pragma unroll
    for (int w = 0; w < QPB; ++w) b = min(b, wanted[w]);
    return b;
  };
  // Block b's 64 keys or values into `dst` asynchronously (zeros past kv_len), one commit group.
  auto stage = [&](T* dst, const S* history, const S* recent, int b) {
    if constexpr (QGROUP == 0) sala_stage_tile<T, D, 32 * QPB>(dst, history, recent, b, kv_len, settled, tid);
  };
  // With codes: this thread's (token, group) units of a block, QGROUP codes each, held in
  // registers from `load` (where `stage` copies rows) to `unpack` (where the copy is waited for).
  constexpr int THREADS = 32 * QPB, GROUPS = QGROUP ? D / QGROUP : 1, UNITS = SALA_MMA_TILE * GROUPS;
  constexpr int UPT = QGROUP ? (UNITS + THREADS - 1) / THREADS : 1, PPU = QGROUP ? QGROUP / 16 : 1;
  uint4 kc[UPT][PPU], vc[UPT][PPU];
  float kq[UPT][2], vq[UPT][2];  // their scales and biases
  auto load = [&](uint4 (&codes)[UPT][PPU], float (&sb)[UPT][2], const S* history, const S* recent, bool keys, int b) {
    if constexpr (QGROUP > 0) {
#pragma unroll
      for (int i = 0; i < UPT; ++i) {
        const int u = i * THREADS + tid, j = u / GROUPS, c = (u % GROUPS) * QGROUP;
        const int tok = b * SALA_MMA_TILE + j;
        const bool ok = u < UNITS && tok < kv_len, old = tok < settled;
        const size_t row = ok ? (old ? tok : tok - settled) : 0;
        const uint4* src = reinterpret_cast<const uint4*>((old ? history : recent) + row * RS + c / 4);
#pragma unroll
        for (int p = 0; p < PPU; ++p) codes[i][p] = ok ? src[p] : make_uint4(0u, 0u, 0u, 0u);
        const size_t at = qsb.template at<D, QGROUP>(h, old, row, c);
        const T* scales = keys ? (old ? qsb.k_scales : qsb.kr_scales) : (old ? qsb.v_scales : qsb.vr_scales);
        const T* biases = keys ? (old ? qsb.k_biases : qsb.kr_biases) : (old ? qsb.v_biases : qsb.vr_biases);
        sb[i][0] = ok ? static_cast<float>(scales[at]) : 0.f;
        sb[i][1] = ok ? static_cast<float>(biases[at]) : 0.f;
      }
    }
  };
  auto unpack = [&](T* dst, const uint4 (&codes)[UPT][PPU], const float (&sb)[UPT][2]) {
    if constexpr (QGROUP > 0) {
#pragma unroll
      for (int i = 0; i < UPT; ++i) {
        const int u = i * THREADS + tid, j = u / GROUPS, c = (u % GROUPS) * QGROUP;
        if (u >= UNITS) break;
#pragma unroll
        for (int p = 0; p < PPU; ++p) {
          float f[16];
          sala_dequant16(codes[i][p], sb[i][0], sb[i][1], f);
          alignas(16) T x[16];
#pragma unroll
          for (int e = 0; e < 16; ++e) x[e] = static_cast<T>(f[e]);
          uint4* o = reinterpret_cast<uint4*>(dst + j * KS + c + 16 * p);
          o[0] = reinterpret_cast<const uint4*>(x)[0];
          o[1] = reinterpret_cast<const uint4*>(x)[1];
        }
      }
    }
  };

  // The union of the warps' ascending block lists, one block at a time: the keys of the next
  // block load while this one's values are used, its values while the next scores are computed
  // (commit groups in the order K(b), V(b), K(next), V(next), ...).
  int mine = next_block();
  int blk = smallest(mine);
  __syncthreads();
  if (blk != INT_MAX) {
    stage(ks, kh, krh, blk);
    stage(vs, vh, vrh, blk);
    load(kc, kq, kh, krh, true, blk);
    load(vc, vq, vh, vrh, false, blk);
  }
  while (blk != INT_MAX) {
    const bool take = mine == blk;
    if (take) {
      ++cursor;
      mine = next_block();
    }
    const int next = smallest(mine);
    asm volatile("cp.async.wait_group 1;");  // K(blk)
    unpack(ks, kc, kq);
    __syncthreads();
    const int base = blk * SALA_MMA_TILE;

    // Scores of the block's 64 tokens: eight 8-column tiles, masked past the query and the cache.
    float s[SALA_MMA_TILE / 8][4];
    if (take) {
      sala_masked_scores<T, D>(s, qa, ks, base, pos, kv_len, scale, lane);
      sala_softmax_rescale(s, m, l, acc);
    }
    __syncthreads();  // ks is free
    if (next != INT_MAX) {
      stage(ks, kh, krh, next);
      load(kc, kq, kh, krh, true, next);
      asm volatile("cp.async.wait_group 1;");  // V(blk)
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    unpack(vs, vc, vq);
    __syncthreads();

    if (take) {
      // P·V 16 tokens at a time.
#pragma unroll
      for (int kk = 0; kk < SALA_MMA_TILE / 16; ++kk) sala_accumulate_pv<T, D>(s[2 * kk], s[2 * kk + 1], m, l, vs, 16 * kk, acc, lane);
    }
    __syncthreads();  // vs is free
    if (next != INT_MAX) {
      stage(vs, vh, vrh, next);
      load(vc, vq, vh, vrh, false, next);
    }
    blk = next;
  }

  if (active) sala_write_query_heads<T, D, G>(out, acc, l, h, t, Tq, lane);
}

// The union of a thread block's block lists, built once before the walk (prefill ring below):
// QPB lists of at most NSEL visible blocks, ascending, in `lists` [QPB][NSEL] with their lengths
// in counts[0 .. QPB); leaves the union, ascending, in `merged` as block | takers << 24 (bit w:
// warp w's query selected it), its length as the return value. A block belongs to the first list
// holding it; its place is the number of blocks below it belonging to any list, counted by
// binary search. Every thread calls it; `owned` holds NSEL ints of scratch per list.
template <int QPB, int NSEL>
__device__ inline int sala_merge_block_lists(const int* lists, int* counts, int* owned, int* merged, int tid) {
  constexpr int THREADS = 32 * QPB, PER = (QPB * NSEL + THREADS - 1) / THREADS;
  // Entries of `list` below b.
  auto below = [&](int list, int b) {
    const int* x = lists + list * NSEL;
    int lo = 0, hi = counts[list];
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (x[mid] < b) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  int takers[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int e = j * THREADS + tid, w = e / NSEL, i = e % NSEL;
    takers[j] = 0;
    bool first = false;
    if (w < QPB && i < counts[w]) {
      const int b = lists[e];
      takers[j] = 1 << w;
      first = true;
      for (int o = 0; o < QPB; ++o) {
        if (o == w) continue;
        const int at = below(o, b);
        if (at < counts[o] && lists[o * NSEL + at] == b) {
          takers[j] |= 1 << o;
          first = first && o > w;
        }
      }
    }
    if (!first) takers[j] = 0;  // only the owning entry places the block
    if (w < QPB) owned[e] = first;
  }
  __syncthreads();
  // Exclusive counts of owned entries along each list, one warp a list; the totals after them.
  const int warp = tid >> 5, lane = tid & 31;
  int total = 0;
  for (int i0 = 0; i0 < NSEL; i0 += 32) {
    const int e = warp * NSEL + i0 + lane;
    const int mine = i0 + lane < NSEL ? owned[e] : 0;
    int incl = mine;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += up;
    }
    if (i0 + lane < NSEL) owned[e] = total + incl - mine;
    total += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) counts[QPB + warp] = total;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    if (!takers[j]) continue;
    const int e = j * THREADS + tid, w = e / NSEL, b = lists[e];
    int place = owned[e];
    for (int o = 0; o < QPB; ++o) {
      if (o == w) continue;
      const int at = below(o, b);
      place += at < counts[o] ? owned[o * NSEL + at] : counts[QPB + o];
    }
    merged[place] = (int)((unsigned)b | (unsigned)takers[j] << 24);
  }
  int n = 0;
#pragma unroll
  for (int w = 0; w < QPB; ++w) n += counts[QPB + w];
  __syncthreads();
  return n;
}

// Dynamic shared memory of sala_block_sparse_prefill_ring: STAGES staged blocks (keys and values,
// rows padded to D + 8), then the block lists and their union (src/kernels/sparse.rs sizes the
// launch for D = 128, 16-bit T, and the largest NSEL and QPB it launches).
template <typename T, int D, int QPB, int NSEL, int STAGES>
__host__ __device__ constexpr int sala_prefill_ring_bytes() {
  return STAGES * 2 * SALA_MMA_TILE * (D + 8) * (int)sizeof(T) + (3 * QPB * NSEL + 2 * QPB) * (int)sizeof(int);
}

// The same attention as sala_block_sparse_prefill over a cache of rows (S = T), walking the union
// of the QPB queries' lists computed once up front, with the blocks staged STAGES − 1 steps ahead
// in a ring of shared tiles: one barrier a block instead of five, and every load has the time of
// STAGES − 1 blocks to arrive. With PRIVATE the walk takes only the blocks of two or more takers,
// then each warp its own blocks (see the top of this file).
template <typename T, int D, int G, int SCALE_BITS, int QPB, int NSEL, int STAGES, bool PRIVATE>
__device__ void sala_block_sparse_prefill_ring(
    const T* q, const T* k, const T* v, const T* kr, const T* vr, const int32_t* blocks, int first_pos, int kv_len, int settled,
    T* out, int Tq, int cap, int rcap, int nsel) {
  static_assert(G <= 16 && D % 32 == 0 && QPB <= 8 && STAGES >= 2, "one 16-row tile of heads; takers in 8 bits");
  constexpr int KS = D + 8, TILE = SALA_MMA_TILE * KS, THREADS = 32 * QPB;
  // A warp's own stream: two slots of 16 tokens' keys and values, within the ring's tiles.
  constexpr int PART = 16, SLOT = 2 * PART * KS, WARP_TILES = 2 * SLOT;
  static_assert(!PRIVATE || QPB * WARP_TILES <= STAGES * 2 * TILE, "the warps' slots fit in the ring");
  extern __shared__ __align__(16) unsigned char sala_dynamic_shared[];
  T* tiles = reinterpret_cast<T*>(sala_dynamic_shared);  // [STAGES][keys, values][64][KS]
  int* lists = reinterpret_cast<int*>(tiles + STAGES * 2 * TILE);
  int* owned = lists + QPB * NSEL;
  int* merged = owned + QPB * NSEL;
  int* counts = merged + QPB * NSEL;  // [QPB] list lengths, [QPB] owned blocks
  unsigned shared_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
  if (shared_bytes < sala_prefill_ring_bytes<T, D, QPB, NSEL, STAGES>() || nsel > NSEL) __trap();  // the launch's sizes disagree

  const int h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = blockIdx.y * QPB + warp;
  const bool active = t < Tq;
  const int pos = first_pos + t;
  const float scale = __int_as_float(SCALE_BITS) * 1.4426950408889634f;  // log2 units for exp2

  // This warp's visible blocks, in order (−1 and blocks past the query or the cache dropped).
  const int32_t* sel = blocks + ((size_t)h * Tq + (active ? t : 0)) * nsel;
  int n = 0;
  for (int i0 = 0; i0 < nsel; i0 += 32) {
    const int i = i0 + lane;
    const int b = active && i < nsel ? sel[i] : -1;
    const bool ok = b >= 0 && b * SALA_MMA_TILE <= pos && b * SALA_MMA_TILE < kv_len;
    const unsigned ballot = __ballot_sync(0xffffffffu, ok);
    if (ok) lists[warp * NSEL + n + __popc(ballot & ((1u << lane) - 1u))] = b;
    n += __popc(ballot);
  }
  if (lane == 0) counts[warp] = n;
  __syncthreads();
  int steps = sala_merge_block_lists<QPB, NSEL>(lists, counts, owned, merged, tid);
  // With PRIVATE: the union's blocks of two or more takers in `owned` for the shared walk, and
  // each warp's blocks of its own back in its list (both free since the merge); every warp scans
  // the same union, so every warp counts the same shared blocks.
  int own = 0;
  if constexpr (PRIVATE) {
    int shared = 0;
    for (int i0 = 0; i0 < steps; i0 += 32) {
      const int i = i0 + lane;
      const unsigned entry = i < steps ? (unsigned)merged[i] : 0u, takers = entry >> 24;
      const unsigned below = (1u << lane) - 1u;
      const unsigned many = __ballot_sync(0xffffffffu, __popc(takers) >= 2), one = __ballot_sync(0xffffffffu, takers == 1u << warp);
      if (warp == 0 && ((many >> lane) & 1u)) owned[shared + __popc(many & below)] = (int)entry;
      if ((one >> lane) & 1u) lists[warp * NSEL + own + __popc(one & below)] = (int)(entry & 0xffffffu);
      shared += __popc(many);
      own += __popc(one);
    }
    __syncthreads();
    steps = shared;
  }
  const int* walk = PRIVATE ? owned : merged;

  uint32_t qa[D / 16][4];
  sala_load_query_heads<D, G>(qa, q, h, t, Tq, active, lane);
  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const T* kh = k + (size_t)h * cap * D;
  const T* vh = v + (size_t)h * cap * D;
  const T* krh = kr + (size_t)h * rcap * D;
  const T* vrh = vr + (size_t)h * rcap * D;
  // Step i's keys and values into slot i % STAGES: two commit groups, empty past the walk's end.
  auto stage = [&](int i) {
    if (i < steps) {
      T* ks = tiles + (i % STAGES) * 2 * TILE;
      const int b = walk[i] & 0xffffff;
      sala_stage_tile<T, D, THREADS>(ks, kh, krh, b, kv_len, settled, tid);
      sala_stage_tile<T, D, THREADS>(ks + TILE, vh, vrh, b, kv_len, settled, tid);
    } else {
      asm volatile("cp.async.commit_group;");
      asm volatile("cp.async.commit_group;");
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) stage(i);
  for (int i = 0; i < steps; ++i) {
    // Step i's groups are done once at most the STAGES − 2 later steps' are pending; the barrier
    // makes every thread's copies visible and frees the slot step i − 1 used.
    asm volatile("cp.async.wait_group %0;" ::"n"(2 * (STAGES - 2)));
    __syncthreads();
    stage(i + STAGES - 1);
    const int entry = walk[i];
    if (!(((unsigned)entry >> (24 + warp)) & 1u)) continue;
    const T* ks = tiles + (i % STAGES) * 2 * TILE;
    const int base = (entry & 0xffffff) * SALA_MMA_TILE;
    float s[SALA_MMA_TILE / 8][4];
    sala_masked_scores<T, D>(s, qa, ks, base, pos, kv_len, scale, lane);
    sala_softmax_rescale(s, m, l, acc);
#pragma unroll
    for (int kk = 0; kk < SALA_MMA_TILE / 16; ++kk) sala_accumulate_pv<T, D>(s[2 * kk], s[2 * kk + 1], m, l, ks + TILE, 16 * kk, acc, lane);
  }
  asm volatile("cp.async.wait_group 0;");

  if constexpr (PRIVATE) {
    __syncthreads();  // every warp is done with the ring's tiles
    // This warp's blocks, 16 tokens a part, part j + 1 requested while part j is used.
    T* slots = tiles + warp * WARP_TILES;
    const int* mine = lists + warp * NSEL;
    auto stage_part = [&](int j) {
      if (j < 4 * own) {
        T* ks = slots + (j & 1) * SLOT;
        const int tok0 = mine[j >> 2] * SALA_MMA_TILE + PART * (j & 3);
        sala_stage_rows<T, D, 32, PART>(ks, kh, krh, tok0, kv_len, settled, lane);
        sala_stage_rows<T, D, 32, PART>(ks + PART * KS, vh, vrh, tok0, kv_len, settled, lane);
      }
      asm volatile("cp.async.commit_group;");
    };
    stage_part(0);
    for (int j = 0; j < 4 * own; ++j) {
      stage_part(j + 1);
      asm volatile("cp.async.wait_group 1;");  // part j
      __syncwarp();                            // and the other lanes' copies of it
      const T* ks = slots + (j & 1) * SLOT;
      float s[PART / 8][4];
      sala_masked_scores<T, D>(s, qa, ks, mine[j >> 2] * SALA_MMA_TILE + PART * (j & 3), pos, kv_len, scale, lane);
      sala_softmax_rescale(s, m, l, acc);
      sala_accumulate_pv<T, D>(s[0], s[1], m, l, ks + PART * KS, 0, acc, lane);
      __syncwarp();  // slot j & 1 is free for part j + 2
    }
    asm volatile("cp.async.wait_group 0;");
  }

  if (active) sala_write_query_heads<T, D, G>(out, acc, l, h, t, Tq, lane);
}

template <typename T, int D, int G, int BLOCK, int SCALE_BITS, int QPB, int NSEL, int STAGES, bool PRIVATE>
__device__ void sala_block_sparse_attention_mma(
    const T* q, const T* k, const T* v, const T* kr, const T* vr, const int32_t* blocks, int first_pos, int kv_len,
    int settled, T* out, int Tq, int cap, int rcap, int nsel) {
  static_assert(BLOCK == SALA_MMA_TILE, "one tile per block");
  sala_block_sparse_prefill_ring<T, D, G, SCALE_BITS, QPB, NSEL, STAGES, PRIVATE>(
      q, k, v, kr, vr, blocks, first_pos, kv_len, settled, out, Tq, cap, rcap, nsel);
}

// The same over an 8-bit cache's codes (words [Hkv, cap, D / 4]) and their scales and biases.
template <typename T, int D, int G, int BLOCK, int SCALE_BITS, int QPB, int QGROUP>
__device__ void sala_block_sparse_attention_mma_q8(
    const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr, SalaKvScales<T> qsb,
    const int32_t* blocks, int first_pos, int kv_len, int settled, T* out, int Tq, int cap, int rcap, int nsel) {
  sala_block_sparse_prefill<T, uint32_t, D, G, BLOCK, SCALE_BITS, QPB, QGROUP>(
      q, k, v, kr, vr, qsb, blocks, first_pos, kv_len, settled, out, Tq, cap, rcap, nsel);
}
