// Metal twin of cuda/block_sparse_attention.cu (same tiling: thread group = (split, query, KV head),
// 8 simdgroups, tiles of 32 tokens in threadgroup memory; CUDA also loads the next tile while
// scoring the current one). The tiles keep the keys' and values' own type: Metal gives a thread
// group 32 KB, and the 9B's tiles as float took 41 KB. Untested on hardware.

#define SALA_TILE 32

template <typename T, int D, int G, int BLOCK, int NSPLIT, int SCALE_BITS>
inline void sala_block_sparse_attention(
    const device T* q, const device T* k, const device T* v, const device T* kr, const device T* vr,
    const device int32_t* blocks, int first_pos, int kv_len, int settled, device float* out, device float* lse,
    int Tq, int cap, int rcap, int nsel, uint3 group, uint tid, uint nthreads, uint kv_heads, uint lane, uint warp,
    threadgroup float* qs, threadgroup T* ks, threadgroup T* vs) {
  constexpr int DPL = (D + 31) / 32;
  constexpr int HPW = (G + 7) / 8;
  constexpr int KS = D + 1;
  const int s = group.x, t = group.y, h = group.z;
  const int Hq = int(kv_heads) * G;
  const int pos = first_pos + t;
  const float scale = as_type<float>(SCALE_BITS);
  for (int e = tid; e < G * D; e += nthreads) {
    qs[e] = float(q[(size_t(h * G + e / D) * Tq + t) * D + e % D]) * scale;
  }
  float m[HPW], l[HPW], acc[HPW][DPL];
  for (int i = 0; i < HPW; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
    for (int j = 0; j < DPL; ++j) acc[i][j] = 0.f;
  }
  // An even share of the selected blocks per split, as on CUDA.
  const int b0 = int((long(s) * nsel) / NSPLIT), b1 = int((long(s + 1) * nsel) / NSPLIT);
  const device int32_t* sel = blocks + (size_t(h) * Tq + t) * nsel;
  const device T* kh = k + size_t(h) * cap * D;
  const device T* vh = v + size_t(h) * cap * D;
  const device T* krh = kr + size_t(h) * rcap * D;
  const device T* vrh = vr + size_t(h) * rcap * D;
  for (int bi = b0; bi < b1; ++bi) {
    const int blk = sel[bi];
    if (blk < 0) continue;
    for (int off = 0; off < BLOCK; off += SALA_TILE) {
      const int base = blk * BLOCK + off;
      if (base > pos || base >= kv_len) break;
      threadgroup_barrier(mem_flags::mem_threadgroup);
      for (int e = tid; e < SALA_TILE * D; e += nthreads) {
        const int j = e / D, c = e % D, tok = base + j;
        const bool ok = tok < kv_len;
        const bool old = tok < settled;
        const size_t at = size_t(old ? tok : tok - settled) * D + c;
        ks[j * KS + c] = ok ? (old ? kh[at] : krh[at]) : T(0);
        vs[j * KS + c] = ok ? (old ? vh[at] : vrh[at]) : T(0);
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
      const int tok = base + int(lane);
      const bool valid = tok <= pos && tok < kv_len;
      for (int i = 0; i < HPW; ++i) {
        const int g = int(warp) + 8 * i;
        if (g >= G) break;
        float sc = 0.f;
        for (int c = 0; c < D; ++c) sc = fma(qs[g * D + c], float(ks[lane * KS + c]), sc);
        sc = valid ? sc : -INFINITY;
        const float new_m = max(m[i], simd_max(sc));
        if (new_m == -INFINITY) continue;
        const float p = valid ? exp(sc - new_m) : 0.f;
        const float alpha = exp(m[i] - new_m);
        l[i] = l[i] * alpha + simd_sum(p);
        for (int j = 0; j < DPL; ++j) acc[i][j] *= alpha;
        for (int jj = 0; jj < SALA_TILE; ++jj) {
          const float pj = simd_shuffle(p, ushort(jj));
          for (int j = 0; j < DPL; ++j) {
            const int c = int(lane) + 32 * j;
            if (c < D) acc[i][j] = fma(pj, float(vs[jj * KS + c]), acc[i][j]);
          }
        }
        m[i] = new_m;
      }
    }
  }
  for (int i = 0; i < HPW; ++i) {
    const int g = int(warp) + 8 * i;
    if (g >= G) break;
    const size_t row = (size_t(t) * Hq + h * G + g) * NSPLIT + s;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    for (int j = 0; j < DPL; ++j) {
      const int c = int(lane) + 32 * j;
      if (c < D) out[row * D + c] = acc[i][j] * inv;
    }
    if (lane == 0) lse[row] = l[i] > 0.f ? m[i] + log(l[i]) : -INFINITY;
  }
}

// Twin of sala_merge_splits in cuda/block_sparse_attention.cu.
template <typename T, int D, int NSPLIT, bool GATED>
inline void sala_merge_splits(const device float* partial, const device float* lse, const device T* gate,
                              int64_t gate_row_stride, int64_t gate_col_stride, device T* out, int R, int Hq,
                              uint idx) {
  if (size_t(idx) >= size_t(R) * Hq * D) return;
  const int c = idx % D;
  const int th = idx / D;
  const device float* l = lse + size_t(th) * NSPLIT;
  float m = -INFINITY;
  for (int s = 0; s < NSPLIT; ++s) m = max(m, l[s]);
  float num = 0.f, den = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < NSPLIT; ++s) {
      const float w = exp(l[s] - m);
      num = fma(w, partial[(size_t(th) * NSPLIT + s) * D + c], num);
      den += w;
    }
  }
  T o = T(den > 0.f ? num / den : 0.f);
  if (GATED) {
    const int r = th / Hq;
    const float g = float(gate[r * gate_row_stride + int64_t((th % Hq) * D + c) * gate_col_stride]);
    const T s = T(1.f / (1.f + exp(-g)));
    o = T(float(o) * float(s));
  }
  out[idx] = o;
}
