// Metal twin of cuda/select_blocks.cu (same steps: level-2 LSE, level-1 window scores rounded to R,
// max-pool to blocks with forced blocks, radix-select top-k with ties to the lower index, ordered
// compaction). Untested on hardware.
// Decode at long context splits it like the CUDA version (sala_select_windows, sala_select_topk).

inline int sala_visible(int pos, int kernel, int stride, int n) {
  return pos >= kernel - 1 ? min(n, (pos - kernel + 1) / stride + 1) : 0;
}

template <int G, int KERNEL2, int STRIDE2>
inline void sala_select_lse(
    const device float* l2, int h, int t, int Tq, int n2, int pos, float scale, threadgroup float* lse,
    uint lane, uint warp, int warps) {
  const int n2v = sala_visible(pos, KERNEL2, STRIDE2, n2);
  for (int g = warp; g < G; g += warps) {
    const device float* row = l2 + ((size_t(h) * G + g) * Tq + t) * n2;
    float mx = -INFINITY;
    for (int w = lane; w < n2v; w += 32) mx = max(mx, row[w] * scale);
    mx = simd_max(mx);
    float sum = 0.f;
    for (int w = lane; w < n2v; w += 32) sum += exp(row[w] * scale - mx);
    sum = simd_sum(sum);
    if (lane == 0) lse[g] = n2v > 0 ? mx + log(sum) : -INFINITY;
  }
}

template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2>
inline void sala_select_window_scores(
    const device float* l1, const threadgroup float* lse, int h, int t, int Tq, int n1, int n2, int pos,
    float scale, device float* window_scores, int w0, int w1, uint tid, int nthreads) {
  const int n2v = sala_visible(pos, KERNEL2, STRIDE2, n2);
  const int n1v = sala_visible(pos, KERNEL, STRIDE, n1);
  device float* ws = window_scores + (size_t(h) * Tq + t) * n1;
  for (int w = w0 + int(tid); w < w1; w += nthreads) {
    float s = 0.f;
    if (w < n1v && n2v > 0) {
      for (int g = 0; g < G; ++g) s += exp(l1[((size_t(h) * G + g) * Tq + t) * n1 + w] * scale - lse[g]);
    }
    ws[w] = float(R(s));
  }
}

template <int KERNEL, int STRIDE, int BLOCK, int INIT, int LOCAL, int TOPK>
inline void sala_select_pool_topk(
    const device float* window_scores, int h, int t, int Tq, int n1, int nb, int pos, device int32_t* blocks,
    device float* scores, uint tid, int nthreads, uint lane, uint warp, threadgroup atomic_uint* hist,
    threadgroup ulong* prefix_sh, threadgroup int* remaining_sh, threadgroup int* warp_counts) {
  const int warps = nthreads / 32;
  const int qb = pos / BLOCK;
  const device float* ws = window_scores + (size_t(h) * Tq + t) * n1;
  constexpr int R_PER_BLOCK = BLOCK / STRIDE;
  constexpr int LEFT = KERNEL / STRIDE - 1;
  device float* sc = scores + (size_t(h) * Tq + t) * nb;
  for (int b = tid; b < nb; b += nthreads) {
    float v;
    if (b < INIT || (b >= qb - LOCAL && b <= qb)) {
      v = INFINITY;
    } else {
      v = -INFINITY;
      const int lo = max(0, R_PER_BLOCK * b - LEFT), hi = min(n1 - 1, R_PER_BLOCK * b + R_PER_BLOCK - 1);
      for (int c = lo; c <= hi; ++c) v = max(v, ws[c]);
    }
    sc[b] = v;
  }
  threadgroup_barrier(mem_flags::mem_device);

  auto key_of = [&](int b) -> ulong {
    const float v = sc[b];
    const ulong ordered = v == -INFINITY ? 0ul : ulong(as_type<uint>(v)) + 1ul;
    return (ordered << 32) | ulong(0xFFFFFFFFu - uint(b));
  };
  const int k = min(TOPK, nb);
  if (tid == 0) {
    *prefix_sh = 0ul;
    *remaining_sh = k;
  }
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += nthreads) atomic_store_explicit(&hist[i], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const ulong prefix = *prefix_sh;
    const ulong mask = shift == 56 ? 0ul : ~0ul << (shift + 8);
    for (int b = tid; b < nb; b += nthreads) {
      const ulong key = key_of(b);
      if ((key & mask) == prefix) atomic_fetch_add_explicit(&hist[(key >> shift) & 255ul], 1u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
      int remaining = *remaining_sh, cum = 0;
      for (int d = 255; d >= 0; --d) {
        const int count = int(atomic_load_explicit(&hist[d], memory_order_relaxed));
        if (cum + count >= remaining) {
          *prefix_sh = prefix | (ulong(d) << shift);
          *remaining_sh = remaining - cum;
          break;
        }
        cum += count;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const ulong threshold = *prefix_sh;

  device int32_t* out = blocks + (size_t(h) * Tq + t) * TOPK;
  int written = 0;
  for (int start = 0; start < nb; start += nthreads) {
    const int b = start + tid;
    const bool take = b < nb && b <= qb && key_of(b) >= threshold;
    const uint rank = simd_prefix_exclusive_sum(uint(take));
    const uint count = simd_sum(uint(take));
    if (lane == 0) warp_counts[warp] = int(count);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    int before = written;
    for (int w = 0; w < int(warp); ++w) before += warp_counts[w];
    if (take) out[before + int(rank)] = b;
    int total = 0;
    for (int w = 0; w < warps; ++w) total += warp_counts[w];
    written += total;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (int i = written + tid; i < TOPK; i += nthreads) out[i] = -1;
}

template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2, int BLOCK, int INIT, int LOCAL,
          int TOPK, int SCALE_BITS>
inline void sala_select_blocks(
    const device float* l1, const device float* l2, int first_pos, int nb, device int32_t* blocks,
    device float* scores, device float* window_scores, int Tq, int n1, int n2, uint3 group, uint tid,
    uint nthreads, uint lane, uint warp, threadgroup float* lse, threadgroup atomic_uint* hist,
    threadgroup ulong* prefix_sh, threadgroup int* remaining_sh, threadgroup int* warp_counts) {
  const int t = group.y, h = group.z, pos = first_pos + t;
  const float scale = as_type<float>(SCALE_BITS);
  sala_select_lse<G, KERNEL2, STRIDE2>(l2, h, t, Tq, n2, pos, scale, lse, lane, warp, int(nthreads) / 32);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  sala_select_window_scores<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2>(
      l1, lse, h, t, Tq, n1, n2, pos, scale, window_scores, 0, n1, tid, int(nthreads));
  threadgroup_barrier(mem_flags::mem_device);
  sala_select_pool_topk<KERNEL, STRIDE, BLOCK, INIT, LOCAL, TOPK>(
      window_scores, h, t, Tq, n1, nb, pos, blocks, scores, tid, int(nthreads), lane, warp, hist, prefix_sh,
      remaining_sh, warp_counts);
}

template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2, int SCALE_BITS, int CHUNK>
inline void sala_select_windows(
    const device float* l1, const device float* l2, int first_pos, device float* window_scores, int n1, int n2,
    uint3 group, uint tid, uint nthreads, uint lane, uint warp, threadgroup float* lse) {
  const int h = group.z;
  const float scale = as_type<float>(SCALE_BITS);
  sala_select_lse<G, KERNEL2, STRIDE2>(l2, h, 0, 1, n2, first_pos, scale, lse, lane, warp, int(nthreads) / 32);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int w0 = int(group.y) * CHUNK;
  sala_select_window_scores<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2>(
      l1, lse, h, 0, 1, n1, n2, first_pos, scale, window_scores, w0, min(n1, w0 + CHUNK), tid, int(nthreads));
}

template <int KERNEL, int STRIDE, int BLOCK, int INIT, int LOCAL, int TOPK>
inline void sala_select_topk(
    const device float* window_scores, int first_pos, int nb, device int32_t* blocks, device float* scores, int n1,
    uint3 group, uint tid, uint nthreads, uint lane, uint warp, threadgroup atomic_uint* hist,
    threadgroup ulong* prefix_sh, threadgroup int* remaining_sh, threadgroup int* warp_counts) {
  sala_select_pool_topk<KERNEL, STRIDE, BLOCK, INIT, LOCAL, TOPK>(
      window_scores, int(group.z), 0, 1, n1, nb, first_pos, blocks, scores, tid, int(nthreads), lane, warp, hist,
      prefix_sh, remaining_sh, warp_counts);
}
