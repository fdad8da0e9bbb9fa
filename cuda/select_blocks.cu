// InfLLM-V2 stage 1 after the two score products (q·c1ᵀ and q·c2ᵀ, done as matrix products by
// MLX; scaled here): for one (KV head h, query t) per thread block,
//   lse_g     = logsumexp over the level-2 windows visible to the query          (per query head g)
//   score[w]  = Σ_g exp(l1[g, w] − lse_g) for visible level-1 windows, else 0, rounded to R
//   pooled[b] = max of score over the windows overlapping block b (−inf if none),
//               +inf for the forced blocks (the first INIT, and the LOCAL+1 up to the query's own)
//   chosen    = the top min(TOPK, nb) blocks, ties to the lower index (radix select on a 64-bit
//               key: order-preserving score bits above, reversed index below), then in ascending
//               order without blocks after the query's own, padded with −1.
//
// Decode (one query) at long context splits this into sala_select_windows (the window scores,
// many thread blocks per KV head) and sala_select_topk (pooling and top-k, one block per KV head),
// or past many blocks sala_select_topk_chunk and sala_select_topk_merge (pooling and top-k over
// many thread blocks): every window score is computed by the same code in the same order, and
// every form picks by the same unique keys, so the blocks are the same.

__device__ __forceinline__ int sala_visible(int pos, int kernel, int stride, int n) {
  return pos >= kernel - 1 ? min(n, (pos - kernel + 1) / stride + 1) : 0;
}

// lse[g] for every query head g of KV head h at query t (one warp per g).
template <int G, int KERNEL2, int STRIDE2>
__device__ void sala_select_lse(const float* l2, int h, int t, int Tq, int n2, int pos, float scale, float* lse) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int n2v = sala_visible(pos, KERNEL2, STRIDE2, n2);
  for (int g = warp; g < G; g += warps) {
    const float* row = l2 + (((size_t)h * G + g) * Tq + t) * n2;
    float mx = -INFINITY;
    for (int w = lane; w < n2v; w += 32) mx = fmaxf(mx, row[w] * scale);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (int w = lane; w < n2v; w += 32) sum += expf(row[w] * scale - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) lse[g] = n2v > 0 ? mx + logf(sum) : -INFINITY;
  }
}

// Window scores ws[w] for w in [w0, w1), one thread per window.
template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2>
__device__ void sala_select_window_scores(
    const float* l1, const float* lse, int h, int t, int Tq, int n1, int n2, int pos, float scale,
    float* window_scores, int w0, int w1) {
  const int n2v = sala_visible(pos, KERNEL2, STRIDE2, n2);
  const int n1v = sala_visible(pos, KERNEL, STRIDE, n1);
  float* ws = window_scores + ((size_t)h * Tq + t) * n1;
  for (int w = w0 + threadIdx.x; w < w1; w += blockDim.x) {
    float s = 0.f;
    if (w < n1v && n2v > 0) {
#pragma unroll
      for (int g = 0; g < G; ++g) s += expf(l1[(((size_t)h * G + g) * Tq + t) * n1 + w] * scale - lse[g]);
    }
    ws[w] = static_cast<float>(static_cast<R>(s));
  }
}

// The selection key of block b with pooled score v: order-preserving score bits above, the
// reversed index below (ties to the lower index). Keys are unique; 0 is below every block's key.
__device__ __forceinline__ unsigned long long sala_topk_key(float v, int b) {
  const unsigned long long ordered = v == -INFINITY ? 0ull : (unsigned long long)__float_as_uint(v) + 1ull;
  return (ordered << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)b);
}

// The block a key was made for.
__device__ __forceinline__ int sala_key_block(unsigned long long key) {
  return (int)(0xFFFFFFFFu - (unsigned int)key);
}

// f(i, key) for this thread's items i = tid, tid + blockDim.x, … of n, keys from `held` for the
// first HELD of them, from key_at(i) after that; trip counts are the same for the whole block (f
// may synchronise; i ≥ n marks a thread without an item that round).
template <int HELD, typename KeyAt, typename F>
__device__ __forceinline__ void sala_for_each_key(const unsigned long long (&held)[HELD], int n, KeyAt&& key_at, F&& f) {
#pragma unroll
  for (int j = 0; j < HELD; ++j) {
    if (j * (int)blockDim.x < n) f(j * (int)blockDim.x + (int)threadIdx.x, held[j]);
  }
  for (int start = HELD * blockDim.x; start < n; start += blockDim.x) {
    const int i = start + threadIdx.x;
    f(i, i < n ? key_at(i) : 0ull);
  }
}

// The k-th largest of the block's n keys (at least k of them nonzero; k ≥ 1): a radix select on
// 8-bit digits from the top, which stops early once the keys at or above the digit found are
// exactly the k wanted. Digits that every nonzero key shares take no pass: with bfloat16 scores
// the low score bits, and the index bits above the largest block (8 passes had become 4).
template <int HELD, typename KeyAt>
__device__ unsigned long long sala_topk_threshold(const unsigned long long (&held)[HELD], int n, KeyAt&& key_at, int k) {
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long prefix_sh, and_sh, or_sh;
  __shared__ int remaining_sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned long long all_and = ~0ull, any_or = 0ull;
  sala_for_each_key(held, n, key_at, [&](int i, unsigned long long key) {
    if (i < n && key != 0ull) {
      all_and &= key;
      any_or |= key;
    }
  });
  for (int o = 16; o > 0; o >>= 1) {
    all_and &= __shfl_xor_sync(0xffffffffu, all_and, o);
    any_or |= __shfl_xor_sync(0xffffffffu, any_or, o);
  }
  if (tid == 0) {
    and_sh = ~0ull;
    or_sh = 0ull;
    prefix_sh = 0ull;
    remaining_sh = k;
  }
  __syncthreads();
  if (lane == 0) {
    atomicAnd(&and_sh, all_and);
    atomicOr(&or_sh, any_or);
  }
  __syncthreads();
  const unsigned long long shared_bits = ~(and_sh ^ or_sh), known = and_sh;
  unsigned long long prefix = 0ull;
  for (int shift = 56; shift >= 0; shift -= 8) {
    // remaining_sh was last written before a barrier.
    if (remaining_sh == 0) break;
    const unsigned long long digit_bits = 255ull << shift;
    if ((shared_bits & digit_bits) == digit_bits) {
      prefix |= known & digit_bits;
      continue;
    }
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
    __syncthreads();
    const unsigned long long mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
    sala_for_each_key(held, n, key_at, [&](int i, unsigned long long key) {
      const bool counted = i < n && (key & mask) == prefix;
      // Lanes with the same digit add once (most keys share the top digits: one shared address).
      const unsigned int digit = counted ? (unsigned int)((key >> shift) & 255ull) : 256u + lane;
      const unsigned int peers = __match_any_sync(0xffffffffu, digit);
      if (counted && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], (unsigned int)__popc(peers));
    });
    __syncthreads();
    if (warp == 0) {
      // The digit holding the remaining-th largest key: lane L sums digits 255 − 8L .. 248 − 8L,
      // a prefix sum over the lanes finds the lane, which then walks its eight digits.
      const int remaining = remaining_sh;
      int own = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) own += hist[255 - 8 * lane - j];
      int upto = own;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, upto, o);
        if (lane >= o) upto += x;
      }
      const unsigned int reached = __ballot_sync(0xffffffffu, upto >= remaining);
      if (lane == __ffs(reached) - 1) {
        int cum = upto - own;
        for (int j = 0; j < 8; ++j) {
          const int d = 255 - 8 * lane - j;
          if (cum + (int)hist[d] >= remaining) {
            prefix_sh = prefix | ((unsigned long long)d << shift);
            // Every key with digit d taken: the lower digits need not be searched.
            remaining_sh = cum + (int)hist[d] == remaining ? 0 : remaining - cum;
            break;
          }
          cum += hist[d];
        }
      }
    }
    __syncthreads();
    prefix = prefix_sh;
  }
  return prefix;
}

// emit(slot, key) for the keys at or above `threshold` whose block is at most `last`, in the
// order of the items, slots 0, 1, …; returns how many.
template <int HELD, typename KeyAt, typename Emit>
__device__ int sala_emit_chosen(
    const unsigned long long (&held)[HELD], int n, KeyAt&& key_at, unsigned long long threshold, int last, Emit&& emit) {
  __shared__ int warp_counts[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int written = 0;
  sala_for_each_key(held, n, key_at, [&](int i, unsigned long long key) {
    const bool take = i < n && key >= threshold && sala_key_block(key) <= last;
    const unsigned int ballot = __ballot_sync(0xffffffffu, take);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = written;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    if (take) emit(before + __popc(ballot & ((1u << lane) - 1u)), key);
    int total = 0;
    for (int w = 0; w < warps; ++w) total += warp_counts[w];
    written += total;
    __syncthreads();
  });
  return written;
}

// A query's level-1 window scores as pooling reads them: the most of the windows overlapping
// block b (−inf if none). The general kernels keep every window score (float, [Hkv, Tq, n1]).
template <int KERNEL, int STRIDE, int BLOCK>
struct SalaWindowScores {
  const float* ws;
  int n1;
  __device__ SalaWindowScores row(int h, int t, int Tq) const { return {ws + ((size_t)h * Tq + t) * n1, n1}; }
  __device__ float most(int b) const {
    constexpr int R_PER_BLOCK = BLOCK / STRIDE, LEFT = KERNEL / STRIDE - 1;
    const int lo = max(0, R_PER_BLOCK * b - LEFT), hi = min(n1 - 1, R_PER_BLOCK * b + R_PER_BLOCK - 1);
    float v = -INFINITY;
    for (int c = lo; c <= hi; ++c) v = fmaxf(v, ws[c]);
    return v;
  }
};

// The tensor-core stage 1 keeps two numbers per group of BLOCK / STRIDE windows (those starting in
// one block), in the score type R: the most of the group and its last window (−inf past n1),
// [Hkv, Tq, groups, 2]. With KERNEL = 2 · STRIDE the windows overlapping block b are group b and
// the last of group b − 1. A quarter of the window scores' bytes at bf16, and the same pooled
// scores: rounding to R is monotone, so the most of rounded scores is the rounded most.
template <typename R, int KERNEL, int STRIDE, int BLOCK>
struct SalaWindowMaxima {
  static_assert(KERNEL == 2 * STRIDE && BLOCK % STRIDE == 0, "windows overlap one block and the last of the previous group");
  const R* m;
  int groups;
  __device__ SalaWindowMaxima row(int h, int t, int Tq) const { return {m + ((size_t)h * Tq + t) * groups * 2, groups}; }
  __device__ float most(int b) const {
    float v = b < groups ? static_cast<float>(m[2 * b]) : -INFINITY;
    if (b >= 1 && b <= groups) v = fmaxf(v, static_cast<float>(m[2 * b - 1]));
    return v;
  }
};

// The pooling source of the kernels below from their input of `len` values a query: window maxima
// (MAXIMA, two a group) or window scores.
template <bool MAXIMA, int KERNEL, int STRIDE, int BLOCK, typename S>
__device__ __forceinline__ auto sala_pooling_windows(const S* windows, int len) {
  if constexpr (MAXIMA) return SalaWindowMaxima<S, KERNEL, STRIDE, BLOCK>{windows, len / 2};
  else return SalaWindowScores<KERNEL, STRIDE, BLOCK>{windows, len};
}

// Pooled score of block b: +inf for the forced blocks (the first INIT, and the LOCAL+1 up to the
// query's block qb), else the most of the windows overlapping it.
template <int INIT, int LOCAL, typename W>
__device__ __forceinline__ float sala_pooled_score(const W& windows, int b, int qb) {
  if (b < INIT || (b >= qb - LOCAL && b <= qb)) return INFINITY;
  return windows.most(b);
}

// Pooled scores of blocks base .. base + n into sc[0 .. n], a thread taking every blockDim.x-th,
// its keys of the first HELD rounds into `held` (0 past n), and the largest of its keys.
template <int INIT, int LOCAL, int HELD, typename W>
__device__ __forceinline__ unsigned long long sala_pool_blocks(
    const W& windows, int base, int n, int qb, float* sc, unsigned long long (&held)[HELD]) {
  unsigned long long largest = 0ull;
  for (int start = 0; start < n; start += blockDim.x) {
    const int i = start + threadIdx.x;
    unsigned long long key = 0ull;
    if (i < n) {
      const float v = sala_pooled_score<INIT, LOCAL>(windows, base + i, qb);
      sc[i] = v;
      key = sala_topk_key(v, base + i);
    }
    largest = key > largest ? key : largest;
    const int round = start / blockDim.x;
#pragma unroll
    for (int j = 0; j < HELD; ++j) {
      if (j == round) held[j] = key;
    }
  }
  return largest;
}

// The chosen blocks (up to `last`) among the k largest of n keys, written as sala_select_pool_topk
// writes them, through at most CANDIDATES keys in shared memory: the k-th largest of the threads'
// largest keys has at least k keys at or above it, so the k largest are all among those keys, and
// a prompt chunk's pooled scores are then swept twice instead of once a radix digit. Returns false
// (every thread) where more keys than CANDIDATES passed, or fewer than k threads had a key: the
// caller then selects from all n.
template <int TOPK, int CANDIDATES, int HELD, typename KeyAt>
__device__ bool sala_topk_from_candidates(
    const unsigned long long (&held)[HELD], int n, KeyAt&& key_at, unsigned long long largest, int k, int last, int32_t* out) {
  __shared__ unsigned long long candidates[CANDIDATES];
  __shared__ int32_t chosen[TOPK];
  __shared__ int passed_sh, chosen_sh;
  if (threadIdx.x == 0) {
    passed_sh = 0;
    chosen_sh = 0;
  }
  if (__syncthreads_count(largest != 0ull) < k) return false;
  const unsigned long long own[1] = {largest};
  const unsigned long long floor_key = sala_topk_threshold(own, blockDim.x, [](int) { return 0ull; }, k);
  sala_for_each_key(held, n, key_at, [&](int i, unsigned long long key) {
    if (i < n && key >= floor_key) {
      const int slot = atomicAdd(&passed_sh, 1);
      if (slot < CANDIDATES) candidates[slot] = key;
    }
  });
  __syncthreads();
  const int passed = passed_sh;
  if (passed > CANDIDATES) return false;
  const unsigned long long first[1] = {(int)threadIdx.x < passed ? candidates[threadIdx.x] : 0ull};
  const unsigned long long threshold = sala_topk_threshold(first, passed, [&](int i) { return candidates[i]; }, k);
  for (int i = threadIdx.x; i < passed; i += blockDim.x) {
    const unsigned long long key = candidates[i];
    if (key >= threshold && sala_key_block(key) <= last) chosen[atomicAdd(&chosen_sh, 1)] = sala_key_block(key);
  }
  __syncthreads();
  // In ascending block order: a chosen block's place is the number of chosen blocks below it.
  const int m = chosen_sh;
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    int place = 0;
    for (int j = 0; j < m; ++j) place += chosen[j] < chosen[i];
    out[place] = chosen[i];
  }
  for (int i = m + threadIdx.x; i < TOPK; i += blockDim.x) out[i] = -1;
  return true;
}

// Pooled block scores and the chosen blocks of (h, t) from its window scores. A thread keeps the
// keys of its first KEYS_HELD blocks in registers (every block up to 4 × blockDim.x: 256K tokens
// at decode's 1024 threads) and reads any others back from `scores` on each pass: at decode the
// passes had waited on those reads one after another (20 µs per layer at 128K tokens, H100).
// Past those, with CANDIDATES > 0, the selection first narrows to sala_topk_from_candidates's keys.
template <int BLOCK, int INIT, int LOCAL, int TOPK, int CANDIDATES = 0, typename W>
__device__ void sala_select_pool_topk(const W& windows, int h, int t, int Tq, int nb, int pos, int32_t* blocks, float* scores) {
  constexpr int KEYS_HELD = 4;
  const int tid = threadIdx.x;
  const int qb = pos / BLOCK;
  float* sc = scores + ((size_t)h * Tq + t) * nb;
  unsigned long long held[KEYS_HELD];
  const unsigned long long largest = sala_pool_blocks<INIT, LOCAL>(windows.row(h, t, Tq), 0, nb, qb, sc, held);
  __syncthreads();

  auto key_at = [&](int b) { return sala_topk_key(sc[b], b); };
  int32_t* out = blocks + ((size_t)h * Tq + t) * TOPK;
  if constexpr (CANDIDATES > 0) {
    if (nb > KEYS_HELD * (int)blockDim.x &&
        sala_topk_from_candidates<TOPK, CANDIDATES>(held, nb, key_at, largest, min(TOPK, nb), qb, out))
      return;
  }
  const unsigned long long threshold = sala_topk_threshold(held, nb, key_at, min(TOPK, nb));
  const int written =
      sala_emit_chosen(held, nb, key_at, threshold, qb, [&](int slot, unsigned long long key) { out[slot] = sala_key_block(key); });
  for (int i = written + tid; i < TOPK; i += blockDim.x) out[i] = -1;
}

// The whole selection for (KV head blockIdx.z, query blockIdx.y).
template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2, int BLOCK, int INIT, int LOCAL,
          int TOPK, int SCALE_BITS>
__device__ void sala_select_blocks(
    const float* l1,          // [Hkv, G, Tq, n1]
    const float* l2,          // [Hkv, G, Tq, n2]
    int first_pos,            // position of query 0
    int nb,                   // blocks in the cache (⌈kv_len / BLOCK⌉)
    int32_t* blocks,          // [Hkv, Tq, TOPK]
    float* scores,            // [Hkv, Tq, nb]
    float* window_scores,     // [Hkv, Tq, n1] (scratch)
    int Tq, int n1, int n2) {
  __shared__ float lse[G];
  const int t = blockIdx.y, h = blockIdx.z, pos = first_pos + t;
  const float scale = __int_as_float(SCALE_BITS);  // the products are unscaled
  sala_select_lse<G, KERNEL2, STRIDE2>(l2, h, t, Tq, n2, pos, scale, lse);
  __syncthreads();
  sala_select_window_scores<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2>(l1, lse, h, t, Tq, n1, n2, pos, scale, window_scores, 0, n1);
  __syncthreads();
  sala_select_pool_topk<BLOCK, INIT, LOCAL, TOPK>(SalaWindowScores<KERNEL, STRIDE, BLOCK>{window_scores, n1}, h, t, Tq, nb, pos, blocks, scores);
}

// Decode, part 1: the window scores of one query, CHUNK windows per thread block (blockIdx.y),
// KV head blockIdx.z.
template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2, int SCALE_BITS, int CHUNK>
__device__ void sala_select_windows(const float* l1, const float* l2, int first_pos, float* window_scores, int n1, int n2) {
  __shared__ float lse[G];
  const int h = blockIdx.z;
  const float scale = __int_as_float(SCALE_BITS);
  sala_select_lse<G, KERNEL2, STRIDE2>(l2, h, 0, 1, n2, first_pos, scale, lse);
  __syncthreads();
  const int w0 = blockIdx.y * CHUNK;
  sala_select_window_scores<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2>(
      l1, lse, h, 0, 1, n1, n2, first_pos, scale, window_scores, w0, min(n1, w0 + CHUNK));
}

// Part 2 (decode, and prefill after sala_select_windows_mma): pooling and top-k of query
// blockIdx.y, KV head blockIdx.z, from window scores [Hkv, Tq, len] or (MAXIMA, S = R) window
// maxima [Hkv, Tq, len / 2, 2].
template <int KERNEL, int STRIDE, int BLOCK, int INIT, int LOCAL, int TOPK, int CANDIDATES, bool MAXIMA, typename S>
__device__ void sala_select_topk(const S* windows, int first_pos, int nb, int32_t* blocks, float* scores, int len) {
  sala_select_pool_topk<BLOCK, INIT, LOCAL, TOPK, CANDIDATES>(sala_pooling_windows<MAXIMA, KERNEL, STRIDE, BLOCK>(windows, len), blockIdx.z, blockIdx.y, gridDim.y, nb, first_pos + blockIdx.y, blocks, scores);
}

// Decode at long context, one thread block per KV head walking every block's key was the
// largest cost of a step that grows with the context; pooling and top-k then run as two kernels:
//   sala_select_topk_chunk  pooled scores of CHUNK blocks (blockIdx.x) and their own top-k keys,
//                           in block order, padded with 0;
//   sala_select_topk_merge  the top-k of those candidates, which hold the top-k of all blocks (a
//                           key among the k largest is among the k largest of its chunk), written
//                           as sala_select_pool_topk writes them. Keys are unique: same blocks.
template <int KERNEL, int STRIDE, int BLOCK, int INIT, int LOCAL, int TOPK, int CHUNK, int HELD, bool MAXIMA, typename S>
__device__ void sala_select_topk_chunk(
    const S* windows, int first_pos, int nb, unsigned long long* candidates, float* scores, int len) {
  const int c = blockIdx.x, t = blockIdx.y, h = blockIdx.z, Tq = gridDim.y, chunks = gridDim.x;
  const int qb = (first_pos + t) / BLOCK;
  const int base = c * CHUNK, n = min(CHUNK, nb - base);
  float* sc = scores + ((size_t)h * Tq + t) * nb + base;
  unsigned long long held[HELD];
  sala_pool_blocks<INIT, LOCAL>(sala_pooling_windows<MAXIMA, KERNEL, STRIDE, BLOCK>(windows, len).row(h, t, Tq), base, n, qb, sc, held);
  __syncthreads();
  auto key_at = [&](int i) { return sala_topk_key(sc[i], base + i); };
  const unsigned long long threshold = sala_topk_threshold(held, n, key_at, min(TOPK, n));
  unsigned long long* out = candidates + (((size_t)h * Tq + t) * chunks + c) * TOPK;
  // Blocks past the query's own are kept here: they count towards the threshold, as in one kernel.
  const int written =
      sala_emit_chosen(held, n, key_at, threshold, 0x7fffffff, [&](int slot, unsigned long long key) { out[slot] = key; });
  for (int i = written + threadIdx.x; i < TOPK; i += blockDim.x) out[i] = 0ull;
}

// The chosen blocks of query blockIdx.y, KV head blockIdx.z from its n candidates.
template <int BLOCK, int TOPK, int HELD>
__device__ void sala_select_topk_merge(const unsigned long long* candidates, int first_pos, int nb, int32_t* blocks, int n) {
  const int t = blockIdx.y, h = blockIdx.z, Tq = gridDim.y;
  const int qb = (first_pos + t) / BLOCK;
  const unsigned long long* cand = candidates + ((size_t)h * Tq + t) * n;
  unsigned long long held[HELD];
#pragma unroll
  for (int j = 0; j < HELD; ++j) {
    const int i = j * blockDim.x + threadIdx.x;
    held[j] = i < n ? cand[i] : 0ull;
  }
  auto key_at = [&](int i) { return cand[i]; };
  const unsigned long long threshold = sala_topk_threshold(held, n, key_at, min(TOPK, nb));
  int32_t* out = blocks + ((size_t)h * Tq + t) * TOPK;
  const int written =
      sala_emit_chosen(held, n, key_at, threshold, qb, [&](int slot, unsigned long long key) { out[slot] = sala_key_block(key); });
  for (int i = written + threadIdx.x; i < TOPK; i += blockDim.x) out[i] = -1;
}
