// InfLLM-V2 stage 1 after the two score products (q·c1ᵀ and q·c2ᵀ, done as matrix products by
// MLX; scaled here): for one (KV head h, query t) per thread block,
//   lse_g     = logsumexp over the level-2 windows visible to the query          (per query head g)
//   score[w]  = Σ_g exp(l1[g, w] − lse_g) for visible level-1 windows, else 0, rounded to R
//   pooled[b] = max of score over the windows overlapping block b (−inf if none),
//               +inf for the forced blocks (the first INIT, and the LOCAL+1 up to the query's own)
//   chosen    = the top min(TOPK, nb) blocks, ties to the lower index (radix select on a 64-bit
//               key: order-preserving score bits above, reversed index below), then in ascending
//               order without blocks after the query's own, padded with −1.

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
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long prefix_sh;
  __shared__ int remaining_sh;
  __shared__ int warp_counts[32];

  const int t = blockIdx.y, h = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const int pos = first_pos + t;
  const float scale = __int_as_float(SCALE_BITS);  // the products are unscaled
  const int qb = pos / BLOCK;

  const int n2v = pos >= KERNEL2 - 1 ? min(n2, (pos - KERNEL2 + 1) / STRIDE2 + 1) : 0;
  const int n1v = pos >= KERNEL - 1 ? min(n1, (pos - KERNEL + 1) / STRIDE + 1) : 0;

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
  __syncthreads();

  float* ws = window_scores + ((size_t)h * Tq + t) * n1;
  for (int w = tid; w < n1; w += blockDim.x) {
    float s = 0.f;
    if (w < n1v && n2v > 0) {
#pragma unroll
      for (int g = 0; g < G; ++g) s += expf(l1[(((size_t)h * G + g) * Tq + t) * n1 + w] * scale - lse[g]);
    }
    ws[w] = static_cast<float>(static_cast<R>(s));
  }
  __syncthreads();

  constexpr int R_PER_BLOCK = BLOCK / STRIDE;
  constexpr int LEFT = KERNEL / STRIDE - 1;
  float* sc = scores + ((size_t)h * Tq + t) * nb;
  for (int b = tid; b < nb; b += blockDim.x) {
    float v;
    if (b < INIT || (b >= qb - LOCAL && b <= qb)) {
      v = INFINITY;
    } else {
      v = -INFINITY;
      const int lo = max(0, R_PER_BLOCK * b - LEFT), hi = min(n1 - 1, R_PER_BLOCK * b + R_PER_BLOCK - 1);
      for (int c = lo; c <= hi; ++c) v = fmaxf(v, ws[c]);
    }
    sc[b] = v;
  }
  __syncthreads();

  auto key_of = [&](int b) -> unsigned long long {
    const float v = sc[b];
    const unsigned long long ordered = v == -INFINITY ? 0ull : (unsigned long long)__float_as_uint(v) + 1ull;
    return (ordered << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)b);
  };

  const int k = min(TOPK, nb);
  if (tid == 0) {
    prefix_sh = 0ull;
    remaining_sh = k;
  }
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0u;
    __syncthreads();
    const unsigned long long prefix = prefix_sh;
    const unsigned long long mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
    for (int b = tid; b < nb; b += blockDim.x) {
      const unsigned long long key = key_of(b);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255ull], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      int remaining = remaining_sh, cum = 0;
      for (int d = 255; d >= 0; --d) {
        if (cum + (int)hist[d] >= remaining) {
          prefix_sh = prefix | ((unsigned long long)d << shift);
          remaining_sh = remaining - cum;
          break;
        }
        cum += hist[d];
      }
    }
    __syncthreads();
  }
  const unsigned long long threshold = prefix_sh;

  int32_t* out = blocks + ((size_t)h * Tq + t) * TOPK;
  int written = 0;
  for (int start = 0; start < nb; start += blockDim.x) {
    const int b = start + tid;
    const bool take = b < nb && b <= qb && key_of(b) >= threshold;
    const unsigned int ballot = __ballot_sync(0xffffffffu, take);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = written;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    if (take) out[before + __popc(ballot & ((1u << lane) - 1u))] = b;
    int total = 0;
    for (int w = 0; w < warps; ++w) total += warp_counts[w];
    written += total;
    __syncthreads();
  }
  for (int i = written + tid; i < TOPK; i += blockDim.x) out[i] = -1;
}
