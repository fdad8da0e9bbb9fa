// One token drawn per row of logits, the row's work spread over the GPU:
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
// inside the bin where the target is crossed, 256 equal ranges of keys at a time, each narrowed to
// the smallest and largest key it holds, until one key is left (at most four more; logits of 16
// bits are seldom more than one). The walks through the bins to the crossing are prefix sums over
// the block's threads. A bin that fits in shared memory is gathered there and narrowed without
// reading the row again. Masses are summed as fixed-point integers (w · 2^40), so no sum depends
// on the order threads add in, and a seeded row draws the same token every run.
//
// A row is SALA_DRAW_SLICES slices, a thread block each, in three of the five launches
// (eval/results/kernel-notes.md):
//   sala_draw_keys    a thread per row: its key, from parameters that stay on the device, and a
//                     zeroed count of the row's finished slices for sala_draw_pick;
//   sala_draw_scan    each slice's maximum and its first index;
//   sala_draw_bins    each slice's values into a histogram of the slice's own;
//   sala_draw_floor   a block per row: the thresholds from the slices' histograms summed (the
//                     narrowing reads the row again only inside the bins where a target is crossed);
//   sala_draw_pick    each slice's best kept s + g, the last slice of a row to finish merging
//                     them into the token.
// The third and fourth run only when a row asks for top-k or top-p. No output needs zeroing
// before a launch: MLX zeroes one with a fill from a scalar the host writes into managed memory,
// and the GPU's first read of it waits on a page fault.

#define SALA_DRAW_BINS 256
#define SALA_DRAW_SPREAD 1024
#define SALA_DRAW_PER_NAT 32.0f
#define SALA_DRAW_LIST 4096
#define SALA_DRAW_SLICES 32

// A block's reductions.
struct SalaDrawReduce {
  unsigned long long scratch[33];
  float vs[32];
  int is[32];
};

struct SalaDrawShared {
  // The first histogram (by distance from the maximum), kept while the narrowing reuses `count` and `mass`.
  unsigned int bin_count[SALA_DRAW_SPREAD + 1];
  unsigned long long bin_mass[SALA_DRAW_SPREAD + 1];
  unsigned int count[SALA_DRAW_BINS];
  unsigned long long mass[SALA_DRAW_BINS];
  // Each range's smallest and largest key.
  unsigned int key_lo[SALA_DRAW_BINS];
  unsigned int key_hi[SALA_DRAW_BINS];
  SalaDrawReduce red;
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

// Words of a row's parameters: temperature's bits, top_k, top_p's bits, ln(min_p)'s bits (−∞:
// off), then the seed and the draw, each as its low and high 32 bits.
#define SALA_DRAW_PARAMS 8

// A row's settings.
struct SalaDrawParams {
  float temperature;
  int top_k;
  float top_p;
  float ln_min_p;
  __device__ SalaDrawParams(const uint32_t* params, int r) {
    const uint32_t* p = params + r * SALA_DRAW_PARAMS;
    temperature = __uint_as_float(p[0]);
    top_k = (int)p[1];
    top_p = __uint_as_float(p[2]);
    ln_min_p = __uint_as_float(p[3]);
  }
  __device__ bool greedy() const { return temperature == 0.0f; }
  __device__ bool top_k_on(int vocab) const { return top_k > 0 && top_k < vocab; }
  __device__ bool top_p_on() const { return top_p < 1.0f; }
  // Whether the row needs the histogram and the thresholds of sala_draw_floor.
  __device__ bool thresholds(int vocab) const { return !greedy() && (top_k_on(vocab) || top_p_on()); }
  template <typename T, bool MASK>
  __device__ SalaDrawRow<T, MASK> row(const T* logits, const uint32_t* words, int r, int vocab, int width) const {
    return SalaDrawRow<T, MASK>{logits + (size_t)r * vocab, words + (size_t)r * width, greedy() ? 1.0f : temperature, vocab};
  }
};

// Slice p of a row, [begin, end): whole 16-byte pieces but for the row's end.
__device__ __forceinline__ void sala_draw_slice(int vocab, int p, int& begin, int& end) {
  const int length = ((vocab + SALA_DRAW_SLICES - 1) / SALA_DRAW_SLICES + 7) & ~7;
  begin = min(p * length, vocab);
  end = min(begin + length, vocab);
}

// f(value, index) for every element of [begin, end) of the row, spread over the block, 16 bytes a
// load where the range allows it.
template <typename T, bool MASK, int THREADS, typename F>
__device__ __forceinline__ void sala_draw_each(const SalaDrawRow<T, MASK>& row, int begin, int end, F f) {
  constexpr int VEC = 16 / sizeof(T);
  if (begin % VEC == 0 && end % VEC == 0 && (reinterpret_cast<size_t>(row.logits) & 15) == 0) {
    for (int v = begin / VEC + threadIdx.x; v < end / VEC; v += THREADS) {
      uint4 raw = reinterpret_cast<const uint4*>(row.logits)[v];
      const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < VEC; ++e) f(row.value(x[e], v * VEC + e), v * VEC + e);
    }
  } else {
    for (int i = begin + threadIdx.x; i < end; i += THREADS) f(row.value(row.logits[i], i), i);
  }
}

// f(value) for every value of the source: the gathered list when `listed` ≥ 0 (that many), else the row.
template <typename T, bool MASK, int THREADS, typename F>
__device__ __forceinline__ void sala_draw_visit(const SalaDrawRow<T, MASK>& row, const SalaDrawShared& sh, int listed, F f) {
  if (listed >= 0) {
    for (int j = threadIdx.x; j < listed; j += THREADS) f(sh.list[j]);
  } else {
    sala_draw_each<T, MASK, THREADS>(row, 0, row.vocab, [&](float v, int) { f(v); });
  }
}

template <int THREADS>
__device__ unsigned long long sala_draw_sum(unsigned long long v, SalaDrawReduce& red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red.scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? red.scratch[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) red.scratch[32] = v;
  }
  __syncthreads();
  return red.scratch[32];
}

// The first i < limit with  above + Σ_{j ≤ i} h(j) ≥ target  (limit if none), and in `before`
// above + Σ_{j < i} h(j): a walk through the bins from the first, the block's threads each summing
// a run of them, then a prefix sum over the threads. The sums are integers, so they equal the
// walk's; to every thread. (Not inlined, nor is sala_draw_refine: inlined, they took the masked
// forms of sala_draw_floor to the 64 registers a thread that its block of 1024 threads allows.)
template <int THREADS, typename H>
__device__ __noinline__ int sala_draw_reach(H h, int limit, unsigned long long above, double target, SalaDrawReduce& red, unsigned long long& before) {
  constexpr int WARPS = THREADS / 32;
  const int per = (limit + THREADS - 1) / THREADS;
  const int first = min((int)threadIdx.x * per, limit), last = min(first + per, limit);
  unsigned long long mine = 0;
  for (int i = first; i < last; ++i) mine += h(i);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long upto = mine;  // the threads' sums up to this one's, within the warp
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long v = __shfl_up_sync(0xffffffffu, upto, o);
    if (lane >= o) upto += v;
  }
  __syncthreads();
  if (lane == 31) red.scratch[warp] = upto;
  if (threadIdx.x == 0) red.is[0] = limit;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = lane < WARPS ? red.scratch[lane] : 0ull;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    if (lane < WARPS) red.scratch[lane] = w;
  }
  __syncthreads();
  unsigned long long run = above + (warp > 0 ? red.scratch[warp - 1] : 0ull) + upto - mine;
  int found = limit;
  for (int i = first; i < last; ++i) {
    const unsigned long long hi = h(i);
    if ((double)(run + hi) >= target) { found = i; break; }
    run += hi;
  }
  if (found < limit) atomicMin(&red.is[0], found);
  __syncthreads();
  const int at = red.is[0];
  if (at < limit && found == at) red.scratch[32] = run;
  if (at == limit && threadIdx.x == THREADS - 1) red.scratch[32] = run;
  __syncthreads();
  before = red.scratch[32];
  return at;
}

// Takes (ov, oi) into (v, i) when it has the larger value, or the same value and a smaller index.
__device__ __forceinline__ void sala_draw_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
}

// (value, index) with the larger value, the smaller index on a tie; to every thread.
template <int THREADS>
__device__ void sala_draw_argmax(float& v, int& i, SalaDrawReduce& red) {
  for (int o = 16; o > 0; o >>= 1) sala_draw_better(v, i, __shfl_down_sync(0xffffffffu, v, o), __shfl_down_sync(0xffffffffu, i, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) { red.vs[warp] = v; red.is[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? red.vs[lane] : -INFINITY;
    i = lane < THREADS / 32 ? red.is[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) sala_draw_better(v, i, __shfl_down_sync(0xffffffffu, v, o), __shfl_down_sync(0xffffffffu, i, o));
    if (lane == 0) { red.vs[0] = v; red.is[0] = i; }
  }
  __syncthreads();
  v = red.vs[0];
  i = red.is[0];
}

// The row's maximum and its first index, from its slices' (sala_draw_scan).
__device__ __forceinline__ void sala_draw_row_max(const float* part_v, const int* part_i, int r, float& m, int& mi) {
  m = -INFINITY;
  mi = 0x7fffffff;
  for (int p = 0; p < SALA_DRAW_SLICES; ++p) sala_draw_better(m, mi, part_v[r * SALA_DRAW_SLICES + p], part_i[r * SALA_DRAW_SLICES + p]);
}

// Gathers bin `bin`'s values into the list (if they fit) and finds their smallest and largest keys;
// returns the list's length, or −1 when the bin is read from the row.
template <typename T, bool MASK, int THREADS>
__device__ int sala_draw_gather(const SalaDrawRow<T, MASK>& row, SalaDrawShared& sh, float m, int bin, unsigned int& lo, unsigned int& hi) {
  __syncthreads();
  if (threadIdx.x == 0) sh.listed = 0;
  __syncthreads();
  unsigned int mine_lo = 0xffffffffu, mine_hi = 0;
  sala_draw_each<T, MASK, THREADS>(row, 0, row.vocab, [&](float v, int) {
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
  if (lane == 0) sh.red.scratch[warp] = (h << 32) | l;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long hh = 0, ll = 0;
    for (int w = 0; w < THREADS / 32; ++w) {
      hh = max(hh, sh.red.scratch[w] >> 32);
      ll = max(ll, sh.red.scratch[w] & 0xffffffffull);
    }
    sh.red.scratch[32] = (hh << 32) | ll;
  }
  __syncthreads();
  hi = (unsigned int)(sh.red.scratch[32] >> 32);
  lo = 0xffffffffu - (unsigned int)(sh.red.scratch[32] & 0xffffffffull);
  const unsigned int n = sh.listed;
  return n <= SALA_DRAW_LIST ? (int)n : -1;
}

// The largest key t in [lo, hi] with  above + Σ_{keys k of the source, t ≤ k ≤ hi, k ≥ floor} (MASS ?
// w : 1) ≥ target,  given that the range holds the crossing (above < target ≤ above + the range's
// total at or above floor). The source is the gathered list, or the row when `listed` < 0.
template <typename T, bool MASK, int THREADS, bool MASS>
__device__ __noinline__ unsigned int sala_draw_refine(const SalaDrawRow<T, MASK>& row, SalaDrawShared& sh, int listed, float m,
                                         unsigned int lo, unsigned int hi, unsigned int floor, unsigned long long above, double target) {
  if (lo < floor) lo = floor;
  while (lo < hi) {
    const unsigned long long width = (unsigned long long)(hi - lo) + 1;
    __syncthreads();
    for (int b = threadIdx.x; b < SALA_DRAW_BINS; b += THREADS) {
      sh.count[b] = 0;
      sh.mass[b] = 0;
      sh.key_lo[b] = 0xffffffffu;
      sh.key_hi[b] = 0;
    }
    __syncthreads();
    sala_draw_visit<T, MASK, THREADS>(row, sh, listed, [&](float v) {
      unsigned int k = sala_draw_key(v);
      if (k < lo || k > hi) return;
      int sub = (int)(((unsigned long long)(k - lo) * SALA_DRAW_BINS) / width);
      if (MASS) atomicAdd(&sh.mass[sub], sala_draw_weight(v, m));
      else atomicAdd(&sh.count[sub], 1u);
      atomicMin(&sh.key_lo[sub], k);
      atomicMax(&sh.key_hi[sub], k);
    });
    __syncthreads();
    // The ranges from the top down to the one the target is crossed in (range 0 if no other).
    auto from_top = [&](int i) { return MASS ? sh.mass[SALA_DRAW_BINS - 1 - i] : (unsigned long long)sh.count[SALA_DRAW_BINS - 1 - i]; };
    const int j = SALA_DRAW_BINS - 1 - sala_draw_reach<THREADS>(from_top, SALA_DRAW_BINS - 1, above, target, sh.red, above);
    if (sh.key_lo[j] <= sh.key_hi[j]) {
      // The answer is one of the keys range j holds.
      lo = sh.key_lo[j];
      hi = sh.key_hi[j];
    } else {
      // Range j holds the keys lo + ⌈j·width/256⌉ … lo + ⌈(j+1)·width/256⌉ − 1.
      const unsigned long long first = ((unsigned long long)j * width + SALA_DRAW_BINS - 1) / SALA_DRAW_BINS;
      const unsigned long long next = ((unsigned long long)(j + 1) * width + SALA_DRAW_BINS - 1) / SALA_DRAW_BINS;
      hi = lo + (unsigned int)(next - 1);
      lo = lo + (unsigned int)first;
    }
  }
  return lo;
}

// splitmix64's finaliser (device_sampler::draw_key's).
__device__ __forceinline__ unsigned long long sala_draw_mix(unsigned long long x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Words a row of sala_draw_keys's output: the key, then the count of the row's slices that
// sala_draw_pick has finished (zeroed here), then two unused words, so that even one row is more
// than the 8 bytes MLX keeps in its managed-memory pool.
#define SALA_DRAW_KEY_WORDS 4

// Launch 0, a thread per row: the row's key, draw_key(seed, draw + advance). The parameters stay
// on the device from draw to draw while only `advance` changes, and it comes as a shape: an
// array the host writes costs the GPU a page fault where a kernel first reads it.
__device__ void sala_draw_keys(const uint32_t* params, uint32_t* keys, int rows, unsigned int advance) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const uint32_t* p = params + r * SALA_DRAW_PARAMS;
  const unsigned long long seed = ((unsigned long long)p[5] << 32) | p[4];
  const unsigned long long draw = (((unsigned long long)p[7] << 32) | p[6]) + advance;
  const unsigned long long h = sala_draw_mix(seed + sala_draw_mix(draw + 0x9E3779B97F4A7C15ull));
  uint32_t* row = keys + r * SALA_DRAW_KEY_WORDS;
  row[0] = (uint32_t)(h ^ (h >> 32));
  row[1] = 0;
}

// Launch 1, a block per slice: the slice's maximum and its first index.
template <typename T, bool MASK, int THREADS>
__device__ void sala_draw_scan(const T* logits, const uint32_t* words, const uint32_t* params, float* part_v, int* part_i, int vocab,
                               int width) {
  __shared__ SalaDrawReduce red;
  const int r = blockIdx.x / SALA_DRAW_SLICES, p = blockIdx.x % SALA_DRAW_SLICES;
  const SalaDrawParams q(params, r);
  const SalaDrawRow<T, MASK> row = q.row<T, MASK>(logits, words, r, vocab, width);
  int begin, end;
  sala_draw_slice(vocab, p, begin, end);
  float m = -INFINITY;
  int mi = 0x7fffffff;
  sala_draw_each<T, MASK, THREADS>(row, begin, end, [&](float v, int i) { sala_draw_better(m, mi, v, i); });
  sala_draw_argmax<THREADS>(m, mi, red);
  if (threadIdx.x == 0) {
    part_v[blockIdx.x] = m;
    part_i[blockIdx.x] = mi;
  }
}

// Slice p of row r's first histogram in `hist` ([rows, SALA_DRAW_SLICES, SALA_DRAW_HIST]
// uint32): each bin's count, then the low and the high 32 bits of its fixed-point mass.
#define SALA_DRAW_HIST (3 * (SALA_DRAW_SPREAD + 1))
struct SalaDrawHist {
  uint32_t* count;
  uint32_t* lo;
  uint32_t* hi;
  __device__ SalaDrawHist(const uint32_t* hist, int r, int p) {
    count = const_cast<uint32_t*>(hist) + ((size_t)r * SALA_DRAW_SLICES + p) * SALA_DRAW_HIST;
    lo = count + SALA_DRAW_SPREAD + 1;
    hi = lo + SALA_DRAW_SPREAD + 1;
  }
};

// Adds w to a mass kept as 32-bit halves, the carry of the low half into the high: exact, so the
// sum does not depend on the order of the additions.
__device__ __forceinline__ void sala_draw_add_mass(unsigned int* lo, unsigned int* hi, unsigned long long w) {
  const unsigned int l = (unsigned int)w, h = (unsigned int)(w >> 32);
  const unsigned int before = atomicAdd(lo, l);
  const unsigned int carried = h + (before + l < before ? 1u : 0u);
  if (carried) atomicAdd(hi, carried);
}

// Launch 2, a block per slice of a row with top-k or top-p: the slice's values into its
// histogram (every word written, so nothing needs zeroing first).
template <typename T, bool MASK, int THREADS>
__device__ void sala_draw_bins(const T* logits, const uint32_t* words, const uint32_t* params, const float* part_v, const int* part_i,
                               uint32_t* hist, int vocab, int width) {
  __shared__ unsigned int count[SALA_DRAW_SPREAD + 1], lo[SALA_DRAW_SPREAD + 1], hi[SALA_DRAW_SPREAD + 1];
  const int r = blockIdx.x / SALA_DRAW_SLICES, p = blockIdx.x % SALA_DRAW_SLICES;
  const SalaDrawParams q(params, r);
  if (!q.thresholds(vocab)) return;
  float m;
  int mi;
  sala_draw_row_max(part_v, part_i, r, m, mi);
  if (m == -INFINITY) return;
  const SalaDrawRow<T, MASK> row = q.row<T, MASK>(logits, words, r, vocab, width);
  int begin, end;
  sala_draw_slice(vocab, p, begin, end);
  for (int b = threadIdx.x; b <= SALA_DRAW_SPREAD; b += THREADS) { count[b] = 0; lo[b] = 0; hi[b] = 0; }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  sala_draw_each<T, MASK, THREADS>(row, begin, end, [&](float v, int) {
    int b = sala_draw_bin(v, m);
    // Most of a row is far below the maximum or masked: counted a warp at a time.
    const unsigned int active = __activemask();
    const unsigned int far = __ballot_sync(active, b == SALA_DRAW_SPREAD);
    if (lane == __ffs(active) - 1 && far) atomicAdd(&count[SALA_DRAW_SPREAD], (unsigned int)__popc(far));
    if (b < SALA_DRAW_SPREAD) {
      atomicAdd(&count[b], 1u);
      sala_draw_add_mass(&lo[b], &hi[b], sala_draw_weight(v, m));
    }
  });
  __syncthreads();
  const SalaDrawHist h(hist, r, p);
  for (int b = threadIdx.x; b <= SALA_DRAW_SPREAD; b += THREADS) {
    h.count[b] = count[b];
    h.lo[b] = lo[b];
    h.hi[b] = hi[b];
  }
}

// Launch 3, a block per row: the key every kept value reaches, max(t_k, t_p) (0 without top-k
// and top-p, min-p aside).
template <typename T, bool MASK, int THREADS>
__device__ void sala_draw_floor(const T* logits, const uint32_t* words, const uint32_t* params, const float* part_v, const int* part_i,
                                const uint32_t* hist, uint32_t* floors, int vocab, int width) {
  __shared__ SalaDrawShared sh;
  const int r = blockIdx.x;
  const SalaDrawParams q(params, r);
  float m;
  int mi;
  sala_draw_row_max(part_v, part_i, r, m, mi);
  unsigned int floor = 0;  // every key is ≥ 0
  if (q.thresholds(vocab) && m != -INFINITY) {
    const SalaDrawRow<T, MASK> row = q.row<T, MASK>(logits, words, r, vocab, width);
    // The slices' histograms summed (integers: the order does not matter).
    for (int b = threadIdx.x; b <= SALA_DRAW_SPREAD; b += THREADS) {
      unsigned int count = 0;
      unsigned long long mass = 0;
      for (int p = 0; p < SALA_DRAW_SLICES; ++p) {
        const SalaDrawHist h(hist, r, p);
        count += h.count[b];
        mass += ((unsigned long long)h.hi[b] << 32) | h.lo[b];
      }
      sh.bin_count[b] = count;
      sh.bin_mass[b] = mass;
    }
    __syncthreads();
    const bool use_k = q.top_k_on(vocab), use_p = q.top_p_on();
    const int top_k = q.top_k;
    auto bin_count = [&](int b) { return (unsigned long long)sh.bin_count[b]; };
    auto bin_mass = [&](int b) { return sh.bin_mass[b]; };
    int kept_bin = SALA_DRAW_SPREAD + 1;  // bins before it are wholly in K
    unsigned long long kept_mass = 0;   // and their mass
    unsigned int k_lo = 0, k_hi = 0;
    int k_listed = -1;
    if (use_k) {
      unsigned long long above;
      const int b = sala_draw_reach<THREADS>(bin_count, SALA_DRAW_SPREAD, 0ull, (double)top_k, sh.red, above);
      unsigned long long mine = 0;
      for (int i = threadIdx.x; i < b; i += THREADS) mine += sh.bin_mass[i];
      kept_mass = sala_draw_sum<THREADS>(mine, sh.red);
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
        total = kept_mass + sala_draw_sum<THREADS>(part, sh.red);
      } else {
        unsigned long long mine = 0;
        for (int i = threadIdx.x; i < SALA_DRAW_SPREAD; i += THREADS) mine += sh.bin_mass[i];
        total = sala_draw_sum<THREADS>(mine, sh.red);
      }
      const double target = (double)q.top_p * (double)total;
      unsigned long long above;
      const int b = sala_draw_reach<THREADS>(bin_mass, min(SALA_DRAW_SPREAD - 1, kept_bin), 0ull, target, sh.red, above);
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
  if (threadIdx.x == 0) floors[r] = floor;
}

// Launch 4, a block per slice: the slice's best kept s + g, g from the row's key (`best_v`,
// `best_i`); the row's last slice to finish (counted in the word after its key, which
// sala_draw_keys zeroed) merges them into its token. A greedy row's token is its first argmax.
// FLOORED: `floors` holds sala_draw_floor's keys (else no row has top-k or top-p).
template <typename T, bool MASK, int THREADS, bool FLOORED>
__device__ void sala_draw_pick(const T* logits, const uint32_t* words, const uint32_t* params, const uint32_t* keys, const float* part_v,
                               const int* part_i, const uint32_t* floors, uint32_t* token, float* best_v, int* best_i, int vocab, int width) {
  __shared__ SalaDrawReduce red;
  __shared__ bool last;
  const int r = blockIdx.x / SALA_DRAW_SLICES, p = blockIdx.x % SALA_DRAW_SLICES;
  const SalaDrawParams q(params, r);
  float m;
  int mi;
  sala_draw_row_max(part_v, part_i, r, m, mi);
  if (q.greedy() || m == -INFINITY) {
    if (p == 0 && threadIdx.x == 0) token[r] = (uint32_t)(mi == 0x7fffffff ? 0 : mi);
    return;
  }
  unsigned int floor = FLOORED ? floors[r] : 0u;
  if (q.ln_min_p > -INFINITY) floor = max(floor, sala_draw_key(m + q.ln_min_p));
  const SalaDrawRow<T, MASK> row = q.row<T, MASK>(logits, words, r, vocab, width);
  int begin, end;
  sala_draw_slice(vocab, p, begin, end);
  float best = -INFINITY;
  int at = 0x7fffffff;
  sala_draw_each<T, MASK, THREADS>(row, begin, end, [&](float v, int j) {
    if (sala_draw_key(v) < floor) return;
    sala_draw_better(best, at, v + sala_draw_gumbel(keys[r * SALA_DRAW_KEY_WORDS], (unsigned int)j), j);
  });
  sala_draw_argmax<THREADS>(best, at, red);
  if (threadIdx.x == 0) {
    best_v[blockIdx.x] = best;
    best_i[blockIdx.x] = at;
    __threadfence();
    unsigned int* done = const_cast<unsigned int*>(keys) + r * SALA_DRAW_KEY_WORDS + 1;
    last = atomicAdd(done, 1u) == SALA_DRAW_SLICES - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    best = -INFINITY;
    at = 0x7fffffff;
    for (int s = 0; s < SALA_DRAW_SLICES; ++s) {
      const int at_s = r * SALA_DRAW_SLICES + s;
      sala_draw_better(best, at, ((volatile float*)best_v)[at_s], ((volatile int*)best_i)[at_s]);
    }
    token[r] = (uint32_t)(at == 0x7fffffff ? 0 : at);
  }
}
