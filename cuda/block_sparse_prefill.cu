// InfLLM-V2 block-sparse attention for prefill on tensor cores (bf16/f16 mma.sync, sm_80 and
// later): the same attention as cuda/block_sparse_attention.cu. CUDA only; Metal's prefill uses
// the general kernel. Thread block = QPB consecutive queries of one KV head, one warp each; the
// G ≤ 16 query heads of the group are the 16 rows of the warp's mma tiles. Nearby queries select
// mostly the same blocks (the local window and much of the top-k), so the thread block walks the
// union of its queries' ascending block lists (64-token blocks): each block's keys and values are
// copied to shared memory once, asynchronously (rows padded by 8 elements so that ldmatrix reads
// without bank conflicts; the next block's keys load while this one's values are used), and every
// warp whose query selected it scores it (Q·Kᵀ, float32 accumulation), keeps its online softmax
// and adds P·V (P rounded to T, as flash attention does). Output in T, [Hq, Tq, D]. An 8-bit
// cache (QGROUP > 0) is read as stored: each thread loads its share of a block's codes, scales and
// biases into registers where the rows would be copied, and writes them dequantized to T into the
// shared tile where the copy would be waited for (shared memory has no room for codes beside the
// two tiles). Uses mma.cu, the shared steps of attention_mma.cu and unpack.cu.

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
  const int r = lane >> 2, c = lane & 3;  // fragment row / column pair
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
      sala_score_tiles<T, D>(s, qa, ks, 0, lane);
#pragma unroll
      for (int nt = 0; nt < SALA_MMA_TILE / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = base + 8 * nt + 2 * c + (e & 1);
          s[nt][e] = (tok <= pos && tok < kv_len) ? s[nt][e] * scale : -INFINITY;
        }
      }
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

  if (!active) return;
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

template <typename T, int D, int G, int BLOCK, int SCALE_BITS, int QPB>
__device__ void sala_block_sparse_attention_mma(
    const T* q, const T* k, const T* v, const T* kr, const T* vr, const int32_t* blocks, int first_pos, int kv_len,
    int settled, T* out, int Tq, int cap, int rcap, int nsel) {
  sala_block_sparse_prefill<T, T, D, G, BLOCK, SCALE_BITS, QPB, 0>(
      q, k, v, kr, vr, SalaKvScales<T>{}, blocks, first_pos, kv_len, settled, out, Tq, cap, rcap, nsel);
}

// The same over an 8-bit cache's codes (words [Hkv, cap, D / 4]) and their scales and biases.
template <typename T, int D, int G, int BLOCK, int SCALE_BITS, int QPB, int QGROUP>
__device__ void sala_block_sparse_attention_mma_q8(
    const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr, SalaKvScales<T> qsb,
    const int32_t* blocks, int first_pos, int kv_len, int settled, T* out, int Tq, int cap, int rcap, int nsel) {
  sala_block_sparse_prefill<T, uint32_t, D, G, BLOCK, SCALE_BITS, QPB, QGROUP>(
      q, k, v, kr, vr, qsb, blocks, first_pos, kv_len, settled, out, Tq, cap, rcap, nsel);
}
