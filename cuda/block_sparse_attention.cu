// InfLLM-V2 block-sparse attention (decode and prefill): each query attends, with one softmax, to
// the tokens of its KV group's selected blocks that are at or before its own position.
//
// Thread block = (KV head h, query t, split s) with 8 warps; the G query heads of the group share
// every key/value tile loaded into shared memory (32 tokens × D, as float). Warp w owns heads
// w, w+8, ...; lane j scores token j of the tile, then every lane accumulates its D/32 output
// dimensions (online softmax, float32). Keys and values come from two buffers, the cache's
// history and its recent tokens (SeqBuffer in src/engine/cache.rs says why). Splits share the
// selected blocks evenly among thread blocks (decode has one query, so one thread block per KV
// head would leave the GPU idle; it gets one split per selected block); each writes its
// normalised partial output and log-sum-exp, merged afterwards. An 8-bit cache (QGROUP > 0) is
// read as it is stored: u32 words of codes, and a scale and a bias per QGROUP values of a row,
// dequantized as the tile goes to shared memory. Needs unpack.cu (sala_unpack16, sala_dequant16,
// SalaKvScales).


#define SALA_TILE 32

template <typename T, typename S, int D, int G, int BLOCK, int NSPLIT, int SCALE_BITS, int QGROUP>
__device__ void sala_attend_blocks(
    const T* q,              // [Hq, Tq, D], heads q_head_stride and dims q_dim_stride apart
    const S* k,              // [Hkv, cap, D]  the cache's history: positions < settled (S = T), or
                             // [Hkv, cap, D / 4] words of codes (S = uint32_t, QGROUP > 0)
    const S* v,              // [Hkv, cap, D]
    const S* kr,             // [Hkv, rcap, D] its recent tokens: positions settled .. kv_len
    const S* vr,             // [Hkv, rcap, D]
    SalaKvScales<T> qsb,     // with codes: their scales and biases
    const int32_t* blocks,   // [Hkv, Tq, nsel], ascending, -1 = none
    int first_pos,           // position of query 0
    int kv_len,              // positions in the cache
    int settled,             // of which in the history buffers
    float* out,              // [Tq, Hq, NSPLIT, D]
    float* lse,              // [Tq, Hq, NSPLIT]
    int t,                   // this thread block's query
    int Tq, int cap, int rcap, int nsel, int64_t q_head_stride, int64_t q_dim_stride) {
  constexpr int THREADS = 256;                // the launch's
  constexpr int DPL = (D + 31) / 32;          // output dims per lane
  constexpr int HPW = (G + 7) / 8;            // heads per warp
  constexpr int VEC = QGROUP ? 16 : 16 / sizeof(T);  // values per 16-byte piece
  constexpr int RS = QGROUP ? D / 4 : D;              // a row's length in S
  static_assert(D % VEC == 0 && QGROUP % VEC == 0, "whole 16-byte pieces per row, each in one group");
  constexpr int PIECES = SALA_TILE * D / VEC; // pieces per tile of keys (and of values)
  constexpr int PER_THREAD = (PIECES + THREADS - 1) / THREADS;
  constexpr int TILES = (BLOCK + SALA_TILE - 1) / SALA_TILE;  // tiles per selected block
  __shared__ float qs[G][D];
  __shared__ float ks[SALA_TILE][D + 1];      // +1: lanes reading different rows hit different banks
  __shared__ float vs[SALA_TILE][D + 1];

  const int s = blockIdx.x, h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int Hq = gridDim.z * G;
  const int pos = first_pos + t;
  const float scale = __int_as_float(SCALE_BITS);  // passed as its bit pattern

  for (int e = tid; e < G * D; e += THREADS) {
    const int g = e / D, c = e % D;
    qs[g][c] = static_cast<float>(q[(h * G + g) * q_head_stride + (size_t)t * D + c * q_dim_stride]) * scale;
  }

  float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
  for (int i = 0; i < HPW; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) acc[i][j] = 0.f;
  }

  // This split's selected blocks: an even share (each split one block when there are as many).
  const int b0 = (int)((long long)s * nsel / NSPLIT), b1 = (int)((long long)(s + 1) * nsel / NSPLIT);
  const int32_t* sel = blocks + ((size_t)h * Tq + t) * nsel;
  const S* kh = k + (size_t)h * cap * RS;
  const S* vh = v + (size_t)h * cap * RS;
  const S* krh = kr + (size_t)h * rcap * RS;
  const S* vrh = vr + (size_t)h * rcap * RS;

  // First token of tile i of the split (tiles of unselected blocks or past the query: −1).
  auto tile_base = [&](int i) -> int {
    const int blk = sel[b0 + i / TILES];
    const int base = blk * BLOCK + (i % TILES) * SALA_TILE;
    return blk < 0 || base > pos || base >= kv_len ? -1 : base;
  };
  // The next tile's keys and values are loaded into registers while the current one is scored,
  // all pieces of a tile at once (one 16-byte load each): a decoding query's splits hold one or
  // two blocks, so without this each tile waited a full memory latency.
  uint4 kreg[PER_THREAD], vreg[PER_THREAD];
  float kq[PER_THREAD][2], vq[PER_THREAD][2];  // with codes: the pieces' scales and biases
  auto fetch = [&](int base) {
#pragma unroll
    for (int p = 0; p < PER_THREAD; ++p) {
      const int e = p * THREADS + tid, j = e / (D / VEC), c = (e % (D / VEC)) * VEC;
      const int tok = base + j;
      const bool ok = e < PIECES && tok < kv_len;
      const bool old = tok < settled;
      const size_t row = old ? tok : tok - settled;
      const size_t at = row * RS + c * RS / D;
      kreg[p] = ok ? *reinterpret_cast<const uint4*>((old ? kh : krh) + at) : make_uint4(0u, 0u, 0u, 0u);
      vreg[p] = ok ? *reinterpret_cast<const uint4*>((old ? vh : vrh) + at) : make_uint4(0u, 0u, 0u, 0u);
      if constexpr (QGROUP > 0) {
        const size_t g = qsb.template at<D, QGROUP>(h, old, row, c);
        kq[p][0] = ok ? static_cast<float>((old ? qsb.k_scales : qsb.kr_scales)[g]) : 0.f;
        kq[p][1] = ok ? static_cast<float>((old ? qsb.k_biases : qsb.kr_biases)[g]) : 0.f;
        vq[p][0] = ok ? static_cast<float>((old ? qsb.v_scales : qsb.vr_scales)[g]) : 0.f;
        vq[p][1] = ok ? static_cast<float>((old ? qsb.v_biases : qsb.vr_biases)[g]) : 0.f;
      }
    }
  };
  const int tiles = (b1 - b0) * TILES;
  int i = 0, base = -1;
  while (i < tiles && (base = tile_base(i)) < 0) ++i;
  if (base >= 0) fetch(base);
  while (base >= 0) {
    __syncthreads();  // the previous tile is consumed (and qs written, the first time)
#pragma unroll
    for (int p = 0; p < PER_THREAD; ++p) {
      const int e = p * THREADS + tid, j = e / (D / VEC), c = (e % (D / VEC)) * VEC;
      if (e < PIECES) {
        float kf[VEC], vf[VEC];
        if constexpr (QGROUP > 0) {
          sala_dequant16(kreg[p], kq[p][0], kq[p][1], kf);
          sala_dequant16(vreg[p], vq[p][0], vq[p][1], vf);
        } else {
          sala_unpack16(kreg[p], (const T*)nullptr, kf);
          sala_unpack16(vreg[p], (const T*)nullptr, vf);
        }
#pragma unroll
        for (int x = 0; x < VEC; ++x) {
          ks[j][c + x] = kf[x];
          vs[j][c + x] = vf[x];
        }
      }
    }
    __syncthreads();
    const int cur = base;
    base = -1;
    for (++i; i < tiles && (base = tile_base(i)) < 0;) ++i;
    if (base >= 0) fetch(base);

    const int tok = cur + lane;
    const bool valid = tok <= pos && tok < kv_len;
#pragma unroll
    for (int hi = 0; hi < HPW; ++hi) {
      const int g = warp + 8 * hi;
      if (g >= G) break;
      float sc = 0.f;
#pragma unroll 8
      for (int c = 0; c < D; ++c) sc = fmaf(qs[g][c], ks[lane][c], sc);
      sc = valid ? sc : -INFINITY;
      float mx = sc;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float new_m = fmaxf(m[hi], mx);
      if (new_m == -INFINITY) continue;  // nothing visible yet (warp-uniform)
      const float p = valid ? expf(sc - new_m) : 0.f;
      const float alpha = expf(m[hi] - new_m);
      float psum = p;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l[hi] = l[hi] * alpha + psum;
#pragma unroll
      for (int j = 0; j < DPL; ++j) acc[hi][j] *= alpha;
      for (int jj = 0; jj < SALA_TILE; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int j = 0; j < DPL; ++j) {
          const int c = lane + 32 * j;
          if (c < D) acc[hi][j] = fmaf(pj, vs[jj][c], acc[hi][j]);
        }
      }
      m[hi] = new_m;
    }
  }

#pragma unroll
  for (int hi = 0; hi < HPW; ++hi) {
    const int g = warp + 8 * hi;
    if (g >= G) break;
    const size_t row = ((size_t)t * Hq + h * G + g) * NSPLIT + s;
    const float inv = l[hi] > 0.f ? 1.f / l[hi] : 0.f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      const int c = lane + 32 * j;
      if (c < D) out[row * D + c] = acc[hi][j] * inv;
    }
    if (lane == 0) lse[row] = l[hi] > 0.f ? m[hi] + logf(l[hi]) : -INFINITY;
  }
}

template <typename T, int D, int G, int BLOCK, int NSPLIT, int SCALE_BITS>
__device__ void sala_block_sparse_attention(
    const T* q, const T* k, const T* v, const T* kr, const T* vr, const int32_t* blocks, int first_pos,
    int kv_len, int settled, float* out, float* lse, int Tq, int cap, int rcap, int nsel) {
  sala_attend_blocks<T, T, D, G, BLOCK, NSPLIT, SCALE_BITS, 0>(
      q, k, v, kr, vr, SalaKvScales<T>{}, blocks, first_pos, kv_len, settled, out, lse, blockIdx.y, Tq, cap, rcap, nsel,
      (int64_t)Tq * D, 1);
}

// The same over an 8-bit cache's codes (words [Hkv, cap, D / 4]) and their scales and biases.
template <typename T, int D, int G, int BLOCK, int NSPLIT, int SCALE_BITS, int QGROUP>
__device__ void sala_block_sparse_attention_q8(
    const T* q, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr, SalaKvScales<T> qsb,
    const int32_t* blocks, int first_pos, int kv_len, int settled, float* out, float* lse, int Tq, int cap, int rcap, int nsel) {
  sala_attend_blocks<T, uint32_t, D, G, BLOCK, NSPLIT, SCALE_BITS, QGROUP>(
      q, k, v, kr, vr, qsb, blocks, first_pos, kv_len, settled, out, lse, blockIdx.y, Tq, cap, rcap, nsel, (int64_t)Tq * D, 1);
}

// Merges the splits' partial outputs (softmax-weighted by their log-sum-exp) of R rows (queries or
// sequences) and writes the result as [R, Hq·D] in the model's dtype, times sigmoid(gate) when
// GATED (gate [R, Hq·D] read through its strides), rounded as MLX's sigmoid and multiply in T
// round them: one thread per output element.
template <typename T, int D, int NSPLIT, bool GATED>
__device__ void sala_merge_splits(
    const float* partial, const float* lse, const T* gate, int64_t gate_row_stride, int64_t gate_col_stride, T* out,
    int R, int Hq) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)R * Hq * D) return;
  const int c = idx % D;
  const int th = idx / D;
  const float* l = lse + (size_t)th * NSPLIT;
  float m = -INFINITY;
#pragma unroll
  for (int s = 0; s < NSPLIT; ++s) m = fmaxf(m, l[s]);
  float num = 0.f, den = 0.f;
  if (m != -INFINITY) {
#pragma unroll
    for (int s = 0; s < NSPLIT; ++s) {
      const float w = expf(l[s] - m);
      num = fmaf(w, partial[((size_t)th * NSPLIT + s) * D + c], num);
      den += w;
    }
  }
  T o = static_cast<T>(den > 0.f ? num / den : 0.f);
  if (GATED) {
    const int r = th / Hq;
    const float g = static_cast<float>(gate[r * gate_row_stride + ((th % Hq) * D + c) * gate_col_stride]);
    const T s = static_cast<T>(1.f / (1.f + expf(-g)));
    o = static_cast<T>(static_cast<float>(o) * static_cast<float>(s));
  }
  out[idx] = o;
}
