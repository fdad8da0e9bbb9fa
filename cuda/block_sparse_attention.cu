// InfLLM-V2 block-sparse attention (decode and prefill): each query attends, with one softmax, to
// the tokens of its KV group's selected blocks that are at or before its own position.
//
// Thread block = (KV head h, query t, split s) with 8 warps; the G query heads of the group share
// every key/value tile loaded into shared memory (32 tokens × D, as float). Warp w owns heads
// w, w+8, ...; lane j scores token j of the tile, then every lane accumulates its D/32 output
// dimensions (online softmax, float32). Keys and values come from two buffers, the cache's history
// and its recent tokens (SeqBuffer in src/engine/cache.rs says why). Splits divide the selected blocks among thread blocks
// (decode has one query, so one block per KV head would leave the GPU idle); each writes its
// normalised partial output and log-sum-exp, merged afterwards.

#define SALA_TILE 32

template <typename T, int D, int G, int BLOCK, int NSPLIT, int SCALE_BITS>
__device__ void sala_block_sparse_attention(
    const T* q,              // [Hq, Tq, D]
    const T* k,              // [Hkv, cap, D]  the cache's history: positions < settled
    const T* v,              // [Hkv, cap, D]
    const T* kr,             // [Hkv, rcap, D] its recent tokens: positions settled .. kv_len
    const T* vr,             // [Hkv, rcap, D]
    const int32_t* blocks,   // [Hkv, Tq, nsel], ascending, -1 = none
    int first_pos,           // position of query 0
    int kv_len,              // positions in the cache
    int settled,             // of which in the history buffers
    float* out,              // [Tq, Hq, NSPLIT, D]
    float* lse,              // [Tq, Hq, NSPLIT]
    int Tq, int cap, int rcap, int nsel) {
  constexpr int DPL = (D + 31) / 32;          // output dims per lane
  constexpr int HPW = (G + 7) / 8;            // heads per warp
  __shared__ float qs[G][D];
  __shared__ float ks[SALA_TILE][D + 1];      // +1: lanes reading different rows hit different banks
  __shared__ float vs[SALA_TILE][D + 1];

  const int s = blockIdx.x, t = blockIdx.y, h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int Hq = gridDim.z * G;
  const int pos = first_pos + t;
  const float scale = __int_as_float(SCALE_BITS);  // passed as its bit pattern

  for (int e = tid; e < G * D; e += blockDim.x) {
    const int g = e / D, c = e % D;
    qs[g][c] = static_cast<float>(q[((size_t)(h * G + g) * Tq + t) * D + c]) * scale;
  }

  float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
  for (int i = 0; i < HPW; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) acc[i][j] = 0.f;
  }

  const int per = (nsel + NSPLIT - 1) / NSPLIT;
  const int b0 = s * per, b1 = min(nsel, b0 + per);
  const int32_t* sel = blocks + ((size_t)h * Tq + t) * nsel;
  const T* kh = k + (size_t)h * cap * D;
  const T* vh = v + (size_t)h * cap * D;
  const T* krh = kr + (size_t)h * rcap * D;
  const T* vrh = vr + (size_t)h * rcap * D;

  for (int bi = b0; bi < b1; ++bi) {
    const int blk = sel[bi];
    if (blk < 0) continue;
    for (int off = 0; off < BLOCK; off += SALA_TILE) {
      const int base = blk * BLOCK + off;
      if (base > pos || base >= kv_len) break;
      __syncthreads();  // the previous tile is consumed (and qs written, the first time)
      for (int e = tid; e < SALA_TILE * D; e += blockDim.x) {
        const int j = e / D, c = e % D;
        const int tok = base + j;
        const bool ok = tok < kv_len;
        const bool old = tok < settled;
        const size_t at = (size_t)(old ? tok : tok - settled) * D + c;
        ks[j][c] = ok ? static_cast<float>(old ? kh[at] : krh[at]) : 0.f;
        vs[j][c] = ok ? static_cast<float>(old ? vh[at] : vrh[at]) : 0.f;
      }
      __syncthreads();
      const int tok = base + lane;
      const bool valid = tok <= pos && tok < kv_len;
#pragma unroll
      for (int i = 0; i < HPW; ++i) {
        const int g = warp + 8 * i;
        if (g >= G) break;
        float sc = 0.f;
#pragma unroll 8
        for (int c = 0; c < D; ++c) sc = fmaf(qs[g][c], ks[lane][c], sc);
        sc = valid ? sc : -INFINITY;
        float mx = sc;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float new_m = fmaxf(m[i], mx);
        if (new_m == -INFINITY) continue;  // nothing visible yet (warp-uniform)
        const float p = valid ? expf(sc - new_m) : 0.f;
        const float alpha = expf(m[i] - new_m);
        float psum = p;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        l[i] = l[i] * alpha + psum;
#pragma unroll
        for (int j = 0; j < DPL; ++j) acc[i][j] *= alpha;
        for (int jj = 0; jj < SALA_TILE; ++jj) {
          const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
          for (int j = 0; j < DPL; ++j) {
            const int c = lane + 32 * j;
            if (c < D) acc[i][j] = fmaf(pj, vs[jj][c], acc[i][j]);
          }
        }
        m[i] = new_m;
      }
    }
  }

#pragma unroll
  for (int i = 0; i < HPW; ++i) {
    const int g = warp + 8 * i;
    if (g >= G) break;
    const size_t row = ((size_t)t * Hq + h * G + g) * NSPLIT + s;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      const int c = lane + 32 * j;
      if (c < D) out[row * D + c] = acc[i][j] * inv;
    }
    if (lane == 0) lse[row] = l[i] > 0.f ? m[i] + logf(l[i]) : -INFINITY;
  }
}

// Merges the splits' partial outputs (softmax-weighted by their log-sum-exp) and writes the
// result as [Hq, Tq, D] in the model's dtype: one thread per output element.
template <typename T, int D, int NSPLIT>
__device__ void sala_merge_splits(const float* partial, const float* lse, T* out, int Tq, int Hq) {
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)Tq * Hq * D) return;
  const int c = idx % D;
  const int th = idx / D;
  const int t = th / Hq, h = th % Hq;
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
  out[((size_t)h * Tq + t) * D + c] = static_cast<T>(den > 0.f ? num / den : 0.f);
}
