// Attention of one decoding query on tensor cores (bf16/f16 mma.sync, sm_80 and later), split
// over the cache (flash-decoding): the same result as cuda/decode_attention.cu for dense decode,
// and as cuda/block_sparse_attention.cu for InfLLM-V2's decode over selected blocks. Thread
// block = (split s, sequence, KV head h) with 4 warps; the G ≤ 16 query heads of the group are
// the 16 rows of every mma tile, so each key and value is read once for the whole group (the
// CUDA-core kernel takes at most 8 heads a thread block and reads a group's keys twice at G = 16,
// and its shuffle-reduced dot products bound it at batch 16: eval/results/kernel-notes.md).
//
// The cache is walked in 64-token tiles: every tile of the cache, or the selected 64-token blocks
// (ascending, −1 = none), split evenly among the thread blocks. A tile's keys and values are
// copied to shared memory asynchronously (the next tile's keys load while this one's values are
// used, as in block_sparse_prefill.cu); warp w scores tokens 16w .. 16w + 15 of it (Q·Kᵀ, float32
// accumulation), keeps its own online softmax in log2 units and adds P·V (P rounded to T, as flash
// attention does). At the end the four warps' states merge through shared memory, and the block
// writes its normalised partial output and natural log-sum-exp for `sala_merge_splits`. Needs
// mma.cu and attention_mma.cu.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_decode_attention_mma needs mma.sync for bf16/f16 and cp.async (compute capability 8.0 or later)"
#endif

template <typename T, int D, int G, int NSPLIT, int SCALE_BITS>
__device__ void sala_decode_attention_mma(
    const T* q,                      // this sequence's query row: head h, value e at (h·D + e)·col
    int64_t col,                     // the row's column stride
    const T* k, const T* v,          // [Hkv, cap, D]  the history: positions < settled
    const T* kr, const T* vr,        // [Hkv, rcap, D] the recent tokens: settled .. kv_len
    int kv_len, int settled, int cap, int rcap,
    const int32_t* blocks,           // [Hkv, nsel] selected blocks, or nullptr: the whole cache
    int nsel,
    float* out,                      // this sequence's [Hq, NSPLIT, D]
    float* lse) {                    // this sequence's [Hq, NSPLIT]
  constexpr int WARPS = 4, TILE = SALA_MMA_TILE, KS = D + 8;
  static_assert(G <= 16 && D % 32 == 0 && sizeof(T) == 2, "one 16-row tile of 16-bit heads");
  static_assert(TILE == 16 * WARPS, "16 tokens a warp");
  // The tile's keys and values; at the end, the warps' states (which fit: 16·D floats a warp).
  __shared__ __align__(16) unsigned char smem[2 * TILE * KS * sizeof(T)];
  static_assert(WARPS * 16 * (D + 2) * sizeof(float) <= sizeof(smem), "the warps' states fit");
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + TILE * KS;

  const int s = blockIdx.x, h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r = lane >> 2, c = lane & 3;  // fragment row / column pair
  // exp2 instead of exp: scores in log2 units.
  const float scale = __int_as_float(SCALE_BITS) * 1.4426950408889634f;

  // The group's heads as A fragments: rows r and r + 8 are heads h·G + r (+ 8), zero past G.
  uint32_t qa[D / 16][4];
  {
    const bool lo = r < G, hi = r + 8 < G;
    const T* q_lo = q + (size_t)(h * G + (lo ? r : 0)) * D * col;
    const T* q_hi = q + (size_t)(h * G + (hi ? r + 8 : 0)) * D * col;
    auto pair = [&](const T* row, bool ok, int e) {
      return ok ? sala_pack(static_cast<float>(row[e * col]), static_cast<float>(row[(e + 1) * col]), T()) : 0u;
    };
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int e = 16 * kk + 2 * c;
      qa[kk][0] = pair(q_lo, lo, e);
      qa[kk][1] = pair(q_hi, hi, e);
      qa[kk][2] = pair(q_lo, lo, e + 8);
      qa[kk][3] = pair(q_hi, hi, e + 8);
    }
  }

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows r, r + 8; l per lane until the end

  // This split's entries of the tile list, and the tile (64-token block) of entry i, or −1.
  const int32_t* sel = blocks ? blocks + (size_t)h * nsel : nullptr;
  const int ntiles = sel ? nsel : (kv_len + TILE - 1) / TILE;
  const int per = (ntiles + NSPLIT - 1) / NSPLIT;
  const int i0 = min(ntiles, s * per), i1 = min(ntiles, i0 + per);
  auto tile_of = [&](int i) {
    const int b = sel ? sel[i] : i;
    return b >= 0 && b * TILE < kv_len ? b : -1;
  };
  auto next_entry = [&](int i) {
    while (i < i1 && tile_of(i) < 0) ++i;
    return i;
  };
  const T* kh = k + (size_t)h * cap * D;
  const T* vh = v + (size_t)h * cap * D;
  const T* krh = kr + (size_t)h * rcap * D;
  const T* vrh = vr + (size_t)h * rcap * D;
  // Tile b's keys or values into `dst` asynchronously (zeros past kv_len), one commit group.
  auto stage = [&](T* dst, const T* history, const T* recent, int b) {
    sala_stage_tile<T, D, 32 * WARPS>(dst, history, recent, b, kv_len, settled, tid);
  };

  // Commit groups in the order K(i), V(i), K(next), V(next), ...
  int i = next_entry(i0);
  if (i < i1) {
    stage(ks, kh, krh, tile_of(i));
    stage(vs, vh, vrh, tile_of(i));
  }
  while (i < i1) {
    const int base = tile_of(i) * TILE + 16 * warp;
    const int next = next_entry(i + 1);
    asm volatile("cp.async.wait_group 1;");  // K(i)
    __syncthreads();

    // Scores of the warp's 16 tokens: two 8-column tiles, masked past the cache.
    float sc[2][4];
    sala_score_tiles<T, D>(sc, qa, ks, 16 * warp, lane);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = base + 8 * nt + 2 * c + (e & 1) < kv_len ? sc[nt][e] * scale : -INFINITY;
    sala_softmax_rescale(sc, m, l, acc);

    __syncthreads();  // ks is free
    if (next < i1) {
      stage(ks, kh, krh, tile_of(next));
      asm volatile("cp.async.wait_group 1;");  // V(i)
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();

    sala_accumulate_pv<T, D>(sc[0], sc[1], m, l, vs, 16 * warp, acc, lane);
    __syncthreads();  // vs is free
    if (next < i1) stage(vs, vh, vrh, tile_of(next));
    i = next;
  }

  // The warps' (m, l, acc) per head row into shared memory (every copy has landed), then each
  // thread merges 16 output values of one row.
  float* sm_acc = reinterpret_cast<float*>(smem);  // [WARPS][16][D]
  float* sm_m = sm_acc + WARPS * 16 * D;            // [WARPS][16]
  float* sm_l = sm_m + WARPS * 16;                  // [WARPS][16]
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
    const int row = r + 8 * j;
    if (c == 0) {
      sm_m[warp * 16 + row] = m[j];
      sm_l[warp * 16 + row] = l[j];
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      sm_acc[(warp * 16 + row) * D + 8 * n + 2 * c] = acc[n][2 * j];
      sm_acc[(warp * 16 + row) * D + 8 * n + 2 * c + 1] = acc[n][2 * j + 1];
    }
  }
  __syncthreads();
  constexpr int PER_ROW = WARPS * 32 / 16;  // threads per head row
  constexpr int SPAN = D / PER_ROW;         // output values per thread
  const int row = tid / PER_ROW, d0 = (tid % PER_ROW) * SPAN;
  if (row >= G) return;
  float top = -INFINITY;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) top = fmaxf(top, sm_m[w * 16 + row]);
  float weight[WARPS], total = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const float mw = sm_m[w * 16 + row];
    weight[w] = mw == -INFINITY ? 0.f : exp2f(mw - top);
    total += sm_l[w * 16 + row] * weight[w];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const size_t at = (size_t)(h * G + row) * NSPLIT + s;
#pragma unroll
  for (int e = 0; e < SPAN; ++e) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) o = fmaf(sm_acc[(w * 16 + row) * D + d0 + e], weight[w], o);
    out[at * D + d0 + e] = o * inv;
  }
  // Natural log: the scores were in log2 units.
  if (d0 == 0) lse[at] = total > 0.f ? (top + log2f(total)) * 0.6931471805599453f : -INFINITY;
}
