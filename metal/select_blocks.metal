// Metal twin of cuda/select_blocks.cu (same steps: level-2 LSE, level-1 window scores rounded to R,
// max-pool to blocks with forced blocks, radix-select top-k with ties to the lower index, ordered
// compaction). Untested on hardware.

template <typename R, int G, int KERNEL, int STRIDE, int KERNEL2, int STRIDE2, int BLOCK, int INIT, int LOCAL,
          int TOPK, int SCALE_BITS>
inline void sala_select_blocks(
    const device float* l1, const device float* l2, int first_pos, int nb, device int32_t* blocks,
    device float* scores, device float* window_scores, int Tq, int n1, int n2, uint3 group, uint tid,
    uint nthreads, uint lane, uint warp, threadgroup float* lse, threadgroup atomic_uint* hist,
    threadgroup ulong* prefix_sh, threadgroup int* remaining_sh, threadgroup int* warp_counts) {
  const int t = group.y, h = group.z;
  const int warps = int(nthreads) / 32;
  const int pos = first_pos + t;
  const float scale = as_type<float>(SCALE_BITS);
  const int qb = pos / BLOCK;
  const int n2v = pos >= KERNEL2 - 1 ? min(n2, (pos - KERNEL2 + 1) / STRIDE2 + 1) : 0;
  const int n1v = pos >= KERNEL - 1 ? min(n1, (pos - KERNEL + 1) / STRIDE + 1) : 0;

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
  threadgroup_barrier(mem_flags::mem_threadgroup);

  device float* ws = window_scores + (size_t(h) * Tq + t) * n1;
  for (int w = tid; w < n1; w += nthreads) {
    float s = 0.f;
    if (w < n1v && n2v > 0) {
      for (int g = 0; g < G; ++g) s += exp(l1[((size_t(h) * G + g) * Tq + t) * n1 + w] * scale - lse[g]);
    }
    ws[w] = float(R(s));
  }
  threadgroup_barrier(mem_flags::mem_device);

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
