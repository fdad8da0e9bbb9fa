// One token drawn per row of logits, in one launch: a thread block per row.
//   s_i = logits_i / temperature                   (−∞ where the grammar's mask clears bit i)
//   t_k = the k-th largest s                       (top-k; none when k is 0 or ≥ vocab)
//   K   = { i : s_i ≥ t_k },  w_i = exp(s_i − max s)
//   t_p = the largest s_j with Σ_{i∈K, s_i ≥ s_j} w_i ≥ top_p · Σ_{i∈K} w_i   (top-p)
//   keep i when s_i ≥ max(t_k, t_p, max s + ln min_p)
//   token = argmax over kept i of s_i + g_i,  g_i Gumbel noise hashed from the row's key and i
// and a greedy row (temperature 0) takes the first argmax of its masked logits. Ties at a
// threshold are all kept; the first index wins an argmax. This is device_sampler::draw's
// definition, which the MLX ops compute with a sort.
//
// No sort here. Values are compared through an order-preserving 32-bit key, and a threshold (the
// largest key whose count or mass from the top reaches a target) is narrowed by histograms: first
// 1024 bins of 1/32 nat below the maximum (one more for everything further, or masked), then,
// inside the bin where the target is crossed, 256 equal ranges of keys at a time until one key is
// left (at most four more). A bin that fits in shared memory is gathered there and narrowed without
// reading the row again. Masses are summed as fixed-point integers (w · 2^40), so no sum depends
// on the order threads add in, and a seeded row draws the same token every run.

#define SALA_DRAW_BINS 256
#define SALA_DRAW_SPREAD 1024
#define SALA_DRAW_PER_NAT 32.0f
#define SALA_DRAW_LIST 4096

struct SalaDrawShared {
  // The first histogram (by distance from the maximum), kept while the narrowing reuses `count` and `mass`.
  unsigned int bin_count[SALA_DRAW_SPREAD + 1];
  unsigned long long bin_mass[SALA_DRAW_SPREAD + 1];
  unsigned int count[SALA_DRAW_BINS];
  unsigned long long mass[SALA_DRAW_BINS];
  unsigned long long scratch[33];
  float vs[32];
  int is[32];
  float list[SALA_DRAW_LIST];
  unsigned int listed;
};

__device__ __forceinline__ unsigned int sala_draw_key(float f) {
  unsigned int u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long sala_draw_weight(float s, float m) {
  return (unsigned long long)(expf(s - m) * 1099511627776.0f);
}

__device__ __forceinline__ int sala_draw_bin(float s, float m) {
  float d = (m - s) * SALA_DRAW_PER_NAT;
  return (d < (float)SALA_DRAW_SPREAD) ? (int)d : SALA_DRAW_SPREAD;
}

// murmur3's finaliser over the index mixed with the key: device_sampler::gumbel's noise.
__device__ __forceinline__ float sala_draw_gumbel(unsigned int key, unsigned int i) {
  unsigned int h = (i * 0x9E3779B1u) ^ key;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  float u = ((float)(h >> 8) + 0.5f) * (1.0f / 16777216.0f);
  return -logf(-logf(u));
}

// The row's scaled, masked logits.
template <typename T, bool MASK>
struct SalaDrawRow {
  const T* logits;
  const uint32_t* words;
  float temperature;
  int vocab;
  __device__ __forceinline__ float value(T x, int i) const {
    if (MASK && !((words[i >> 5] >> (i & 31)) & 1u)) return -INFINITY;
    return __fdiv_rn(static_cast<float>(x), temperature);
  }
};

// f(value, index) for every element of the row, spread over the block, 16 bytes a load where the
// row allows it.
template <typename T, bool MASK, int THREADS, typename F>
__device__ __forceinline__ void sala_draw_each(const SalaDrawRow<T, MASK>& row, F f) {
  constexpr int VEC = 16 / sizeof(T);
  if (row.vocab % VEC == 0 && (reinterpret_cast<size_t>(row.logits) & 15) == 0) {
    const int vectors = row.vocab / VEC;
    for (int v = threadIdx.x; v < vectors; v += THREADS) {
      uint4 raw = reinterpret_cast<const uint4*>(row.logits)[v];
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < VEC; ++e) f(row.value(x[e], v * VEC + e), v * VEC + e);
    }
  } else {
    for (int i = threadIdx.x; i < row.vocab; i += THREADS) f(row.value(row.logits[i], i), i);
  }
}

// f(value) for every value of the source: the gathered list when `listed` ≥ 0 (that many), else the row.
template <typename T, bool MASK, int THREADS, typename F>
__device__ __forceinline__ void sala_draw_visit(const SalaDrawRow<T, MASK>& row, const SalaDrawShared& sh, int listed, F f) {
  if (listed >= 0) {
    for (int j = threadIdx.x; j < listed; j += THREADS) f(sh.list[j]);
  } else {
    sala_draw_each<T, MASK, THREADS>(row, [&](float v, int) { f(v); });
  }
}

template <int THREADS>
__device__ unsigned long long sala_draw_sum(unsigned long long v, SalaDrawShared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? sh.scratch[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) sh.scratch[32] = v;
  }
  __syncthreads();
  return sh.scratch[32];
}

// (value, index) with the larger value, the smaller index on a tie; to every thread.
template <int THREADS>
__device__ void sala_draw_argmax(float& v, int& i, SalaDrawShared& sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_down_sync(0xffffffffu, v, o);
    int oi = __shfl_down_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) { sh.vs[warp] = v; sh.is[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? sh.vs[lane] : -INFINITY;
    i = lane < THREADS / 32 ? sh.is[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_down_sync(0xffffffffu, v, o);
      int oi = __shfl_down_sync(0xffffffffu, i, o);
      if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
    }
    if (lane == 0) { sh.vs[0] = v; sh.is[0] = i; }
  }
  __syncthreads();
  v = sh.vs[0];
  i = sh.is[0];
}

// Gathers bin `bin`'s values into the list (if they fit) and finds their smallest and largest keys;
// returns the list's length, or −1 when the bin is read from the row.
template <typename T, bool MASK, int THREADS>
__device__ int sala_draw_gather(const SalaDrawRow<T, MASK>& row, SalaDrawShared& sh, float m, int bin, unsigned int& lo, unsigned int& hi) {
  __syncthreads();
  if (threadIdx.x == 0) sh.listed = 0;
  __syncthreads();
  unsigned int mine_lo = 0xffffffffu, mine_hi = 0;
  sala_draw_each<T, MASK, THREADS>(row, [&](float v, int) {
    if (sala_draw_bin(v, m) != bin) return;
    unsigned int k = sala_draw_key(v);
    mine_lo = min(mine_lo, k);
    mine_hi = max(mine_hi, k);
    unsigned int at = atomicAdd(&sh.listed, 1u);
    if (at < SALA_DRAW_LIST) sh.list[at] = v;
  });
  // The smallest key as the largest complement, beside the largest, in one reduction.
  unsigned long long packed = ((unsigned long long)mine_hi << 32) | (0xffffffffu - mine_lo);
  unsigned long long h = packed >> 32, l = packed & 0xffffffffull;
  for (int o = 16; o > 0; o >>= 1) {
    h = max(h, __shfl_down_sync(0xffffffffu, h, o));
    l = max(l, __shfl_down_sync(0xffffffffu, l, o));
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.scratch[warp] = (h << 32) | l;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long hh = 0, ll = 0;
    for (int w = 0; w < THREADS / 32; ++w) {
      hh = max(hh, sh.scratch[w] >> 32);
      ll = max(ll, sh.scratch[w] & 0xffffffffull);
    }
    sh.scratch[32] = (hh << 32) | ll;
  }
  __syncthreads();
  hi = (unsigned int)(sh.scratch[32] >> 32);
  lo = 0xffffffffu - (unsigned int)(sh.scratch[32] & 0xffffffffull);
  const unsigned int n = sh.listed;
  return n <= SALA_DRAW_LIST ? (int)n : -1;
}

// The largest key t in [lo, hi] with  above + Σ_{keys k of the source, t ≤ k ≤ hi, k ≥ floor} (MASS ?
// w : 1) ≥ target,  given that the range holds the crossing (above < target ≤ above + the range's
// total at or above floor). The source is the gathered list, or the row when `listed` < 0.
template <typename T, bool MASK, int THREADS, bool MASS>
__device__ unsigned int sala_draw_refine(const SalaDrawRow<T, MASK>& row, SalaDrawShared& sh, int listed, float m,
                                         unsigned int lo, unsigned int hi, unsigned int floor, unsigned long long above, double target) {
  if (lo < floor) lo = floor;
  while (lo < hi) {
    const unsigned long long width = (unsigned long long)(hi - lo) + 1;
    __syncthreads();
    for (int b = threadIdx.x; b < SALA_DRAW_BINS; b += THREADS) { sh.count[b] = 0; sh.mass[b] = 0; }
    __syncthreads();
    sala_draw_visit<T, MASK, THREADS>(row, sh, listed, [&](float v) {
      unsigned int k = sala_draw_key(v);
      if (k < lo || k > hi) return;
      int sub = (int)(((unsigned long long)(k - lo) * SALA_DRAW_BINS) / width);
      if (MASS) atomicAdd(&sh.mass[sub], sala_draw_weight(v, m));
      else atomicAdd(&sh.count[sub], 1u);
    });
    __syncthreads();
    // Every thread walks the ranges from the top to the one the target is crossed in.
    int j = SALA_DRAW_BINS - 1;
    for (; j > 0; --j) {
      unsigned long long h = MASS ? sh.mass[j] : (unsigned long long)sh.count[j];
      if ((double)(above + h) >= target) break;
      above += h;
    }
    // Range j holds the keys lo + ⌈j·width/256⌉ … lo + ⌈(j+1)·width/256⌉ − 1.
    const unsigned long long first = ((unsigned long long)j * width + SALA_DRAW_BINS - 1) / SALA_DRAW_BINS;
    const unsigned long long next = ((unsigned long long)(j + 1) * width + SALA_DRAW_BINS - 1) / SALA_DRAW_BINS;
    hi = lo + (unsigned int)(next - 1);
    lo = lo + (unsigned int)first;
  }
  return lo;
}

// params per row: temperature's bits, top_k, top_p's bits, ln(min_p)'s bits (−∞: off), key.
template <typename T, bool MASK, int THREADS>
__device__ void sala_draw(const T* logits, const uint32_t* words, const uint32_t* params, uint32_t* token, int vocab, int width) {
  __shared__ SalaDrawShared sh;
  const int r = blockIdx.x;
  const uint32_t* p = params + r * 5;
  const float temperature = __uint_as_float(p[0]);
  const int top_k = (int)p[1];
  const float top_p = __uint_as_float(p[2]);
  const float ln_min_p = __uint_as_float(p[3]);
  const unsigned int key = p[4];
  const bool greedy = temperature == 0.0f;
  SalaDrawRow<T, MASK> row{logits + (size_t)r * vocab, words + (size_t)r * width, greedy ? 1.0f : temperature, vocab};

  // The maximum (and, for a greedy row, its first index).
  float m = -INFINITY;
  int mi = 0x7fffffff;
  sala_draw_each<T, MASK, THREADS>(row, [&](float v, int i) {
    if (v > m || (v == m && i < mi)) { m = v; mi = i; }
  });
  sala_draw_argmax<THREADS>(m, mi, sh);
  if (greedy || m == -INFINITY) {
    if (threadIdx.x == 0) token[r] = (uint32_t)(mi == 0x7fffffff ? 0 : mi);
    return;
  }

  unsigned int floor = 0;  // every key is ≥ 0
  const bool use_k = top_k > 0 && top_k < vocab;
  const bool use_p = top_p < 1.0f;
  if (use_k || use_p) {
    for (int b = threadIdx.x; b <= SALA_DRAW_SPREAD; b += THREADS) { sh.bin_count[b] = 0; sh.bin_mass[b] = 0; }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    sala_draw_each<T, MASK, THREADS>(row, [&](float v, int) {
      int b = sala_draw_bin(v, m);
      // Most of a row is far below the maximum or masked: counted a warp at a time.
      const unsigned int active = __activemask();
      const unsigned int far = __ballot_sync(active, b == SALA_DRAW_SPREAD);
      if (lane == __ffs(active) - 1 && far) atomicAdd(&sh.bin_count[SALA_DRAW_SPREAD], (unsigned int)__popc(far));
      if (b < SALA_DRAW_SPREAD) {
        atomicAdd(&sh.bin_count[b], 1u);
        atomicAdd(&sh.bin_mass[b], sala_draw_weight(v, m));
      }
    });
    __syncthreads();
    // Walked from the top by every thread: the same answer everywhere.
    int kept_bin = SALA_DRAW_SPREAD + 1;  // bins before it are wholly in K
    unsigned long long kept_mass = 0;   // and their mass
    unsigned int k_lo = 0, k_hi = 0;
    int k_listed = -1;
    if (use_k) {
      unsigned long long above = 0;
      int b = 0;
      while (b < SALA_DRAW_SPREAD && above + sh.bin_count[b] < (unsigned long long)top_k) { above += sh.bin_count[b]; kept_mass += sh.bin_mass[b]; ++b; }
      k_listed = sala_draw_gather<T, MASK, THREADS>(row, sh, m, b, k_lo, k_hi);
      floor = sala_draw_refine<T, MASK, THREADS, false>(row, sh, k_listed, m, k_lo, k_hi, 0u, above, (double)top_k);
      kept_bin = b;
    }
    if (use_p) {
      // K's mass: the bins before kept_bin, and the part of kept_bin at or above t_k.
      unsigned long long total = 0;
      if (use_k) {
        unsigned long long part = 0;
        if (kept_bin < SALA_DRAW_SPREAD) {
          sala_draw_visit<T, MASK, THREADS>(row, sh, k_listed, [&](float v) {
            unsigned int k = sala_draw_key(v);
            if (k >= floor && k >= k_lo && k <= k_hi) part += sala_draw_weight(v, m);
          });
        }
        total = kept_mass + sala_draw_sum<THREADS>(part, sh);
      } else {
        for (int b = 0; b < SALA_DRAW_SPREAD; ++b) total += sh.bin_mass[b];
      }
      const double target = (double)top_p * (double)total;
      unsigned long long above = 0;
      int b = 0;
      while (b < SALA_DRAW_SPREAD - 1 && b < kept_bin && (double)(above + sh.bin_mass[b]) < target) { above += sh.bin_mass[b]; ++b; }
      unsigned int t_p;
      if (b == kept_bin) {
        // The crossing is in the bin top-k ended in: its values are still where they were gathered.
        t_p = sala_draw_refine<T, MASK, THREADS, true>(row, sh, k_listed, m, k_lo, k_hi, floor, above, target);
      } else {
        unsigned int lo, hi;
        const int listed = sala_draw_gather<T, MASK, THREADS>(row, sh, m, b, lo, hi);
        t_p = sala_draw_refine<T, MASK, THREADS, true>(row, sh, listed, m, lo, hi, 0u, above, target);
      }
      floor = max(floor, t_p);
    }
  }
  if (ln_min_p > -INFINITY) floor = max(floor, sala_draw_key(m + ln_min_p));

  float best = -INFINITY;
  int at = 0x7fffffff;
  sala_draw_each<T, MASK, THREADS>(row, [&](float v, int j) {
    if (sala_draw_key(v) < floor) return;
    float c = v + sala_draw_gumbel(key, (unsigned int)j);
    if (c > best || (c == best && j < at)) { best = c; at = j; }
  });
  sala_draw_argmax<THREADS>(best, at, sh);
  if (threadIdx.x == 0) token[r] = (uint32_t)(at == 0x7fffffff ? 0 : at);
}
