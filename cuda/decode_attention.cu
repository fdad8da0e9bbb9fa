// Dense attention of one decoding query per sequence over that sequence's whole cache, split
// over the cache's length (flash-decoding): thread block = (split s, sequence, z) with 4 warps,
// z = KV head · (G / GB) + part of its group. The block takes GB of the group's G query heads and
// the tokens of split s; each warp streams its own tokens straight from global memory into
// registers, 16 bytes a lane, LPT lanes a token row of D values, LOADS rows in flight per lane
// for the keys and for the values, and scores each row for its GB heads at once (a dot product
// over the row's lanes, reduced by shuffles). Online softmax per lane in float32; at the end the
// warp's token slots, then the warps, merge their (max, sum, output), and the block writes its
// normalised partial output and log-sum-exp for `sala_merge_splits` (a separate launch: merged by
// the last block of each head group, the attention itself ran slower; eval/results/kernel-notes.md).
//
// A row of keys is read once for the GB heads, and nothing is staged in shared memory between
// the loads and the arithmetic: the kernel this replaced read 32-token tiles into shared memory
// and two floats from it per multiply-add, which held it below half of MLX's own attention at
// 128K tokens (eval/results/kernel-notes.md). Keys and values come from two buffers, the cache's
// history and its recent tokens (SeqBuffer in src/engine/cache.rs says why). An 8-bit cache
// (QGROUP > 0) is read as stored: a lane loads the codes of its EPL values (half or a quarter of
// the 16 bytes a plain row takes, so the lanes keep the plain layout) and their group's scale and
// bias. Needs unpack.cu.

template <typename T, typename S, int D, int G, int GB, int NSPLIT, int SCALE_BITS, int QGROUP>
__device__ void sala_decode_attention_rows(
    const T* q,                      // this sequence's query row: head h, value e at (h·D + e)·col
    int64_t col,                     // the row's column stride
    const S* k, const S* v,          // [Hkv, cap, D]  the history: positions < settled (S = T), or
                                     // [Hkv, cap, D / 4] words of codes (S = uint32_t, QGROUP > 0)
    const S* kr, const S* vr,        // [Hkv, rcap, D] the recent tokens: settled .. kv_len
    SalaKvScales<T> qsb,             // with codes: their scales and biases
    int kv_len, int settled, int cap, int rcap,
    float* out,                      // this sequence's [Hq, NSPLIT, D]
    float* lse) {                    // this sequence's [Hq, NSPLIT]
  constexpr int WARPS = 4;
  constexpr int EPL = 16 / sizeof(T);   // values per lane and load
  constexpr int RS = QGROUP ? D / 4 : D;  // a row's length in S
  static_assert(QGROUP % EPL == 0, "a lane's values in one group");
  constexpr int LPT = D / EPL;          // lanes per token row
  static_assert(D % EPL == 0 && LPT <= 32 && 32 % LPT == 0, "a token row is a power-of-two share of a warp");
  constexpr int TPW = 32 / LPT;         // token rows per warp and load
  constexpr int LOADS = GB <= 4 ? 4 : 2;
  constexpr int CHUNK = WARPS * TPW * LOADS;

  const int s = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slot = lane / LPT, part = lane % LPT;
  const int head0 = blockIdx.z * GB;    // the block's query heads: head0 .. head0 + GB
  const int kvh = head0 / G;
  const float scale = __int_as_float(SCALE_BITS);

  float qr[GB][EPL];
#pragma unroll
  for (int g = 0; g < GB; ++g)
#pragma unroll
    for (int e = 0; e < EPL; ++e)
      qr[g][e] = static_cast<float>(q[((head0 + g) * D + part * EPL + e) * col]) * scale;

  float m[GB], l[GB], acc[GB][EPL];
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = 0.f;
  }

  const int per = (kv_len + NSPLIT - 1) / NSPLIT;
  const int t0 = s * per, t1 = min(kv_len, t0 + per);
  const S* kh = k + (size_t)kvh * cap * RS + part * EPL * RS / D;
  const S* vh = v + (size_t)kvh * cap * RS + part * EPL * RS / D;
  const S* krh = kr + (size_t)kvh * rcap * RS + part * EPL * RS / D;
  const S* vrh = vr + (size_t)kvh * rcap * RS + part * EPL * RS / D;

  for (int base = t0 + warp * TPW * LOADS; base < t1; base += CHUNK) {
    uint4 kreg[LOADS], vreg[LOADS];
    float kq[LOADS][2], vq[LOADS][2];  // with codes: their scales and biases
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int tok = base + i * TPW + slot;
      const bool ok = tok < t1, old = tok < settled;
      const size_t row = old ? tok : tok - settled, at = row * RS;
      if constexpr (QGROUP > 0) {
        kreg[i] = ok ? sala_load_codes<EPL>((old ? kh : krh) + at) : make_uint4(0u, 0u, 0u, 0u);
        vreg[i] = ok ? sala_load_codes<EPL>((old ? vh : vrh) + at) : make_uint4(0u, 0u, 0u, 0u);
        const size_t g = qsb.template at<D, QGROUP>(kvh, old, row, part * EPL);
        kq[i][0] = ok ? static_cast<float>((old ? qsb.k_scales : qsb.kr_scales)[g]) : 0.f;
        kq[i][1] = ok ? static_cast<float>((old ? qsb.k_biases : qsb.kr_biases)[g]) : 0.f;
        vq[i][0] = ok ? static_cast<float>((old ? qsb.v_scales : qsb.vr_scales)[g]) : 0.f;
        vq[i][1] = ok ? static_cast<float>((old ? qsb.v_biases : qsb.vr_biases)[g]) : 0.f;
      } else {
        kreg[i] = ok ? *reinterpret_cast<const uint4*>((old ? kh : krh) + at) : make_uint4(0u, 0u, 0u, 0u);
        vreg[i] = ok ? *reinterpret_cast<const uint4*>((old ? vh : vrh) + at) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
    // A lane's EPL values of a loaded row as floats.
    auto values = [&](const uint4& u, const float (&sb)[2], float* f) {
      if constexpr (QGROUP > 0) {
        sala_dequant<EPL>(u, sb[0], sb[1], f);
      } else {
        sala_unpack16(u, (const T*)nullptr, f);
      }
    };
    float p[LOADS][GB];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      float kf[EPL];
      values(kreg[i], kq[i], kf);
      const bool ok = base + i * TPW + slot < t1;
#pragma unroll
      for (int g = 0; g < GB; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) dot = fmaf(qr[g][e], kf[e], dot);
#pragma unroll
        for (int off = LPT / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        p[i][g] = ok ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      float mx = m[g];
#pragma unroll
      for (int i = 0; i < LOADS; ++i) mx = fmaxf(mx, p[i][g]);
      const float alpha = mx == -INFINITY ? 1.f : expf(m[g] - mx);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < LOADS; ++i) {
        p[i][g] = mx == -INFINITY ? 0.f : expf(p[i][g] - mx);
        sum += p[i][g];
      }
      l[g] = l[g] * alpha + sum;
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[g][e] *= alpha;
      m[g] = mx;
    }
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      float vf[EPL];
      values(vreg[i], vq[i], vf);
#pragma unroll
      for (int g = 0; g < GB; ++g)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] = fmaf(p[i][g], vf[e], acc[g][e]);
    }
  }

  // (m, l, acc) of another part of the softmax merged into this one.
  auto merge = [&](int g, float om, float ol, const float* oacc) {
    const float nm = fmaxf(m[g], om);
    const float a = m[g] == -INFINITY ? 0.f : expf(m[g] - nm);
    const float b = om == -INFINITY ? 0.f : expf(om - nm);
    l[g] = l[g] * a + ol * b;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[g][e] = acc[g][e] * a + oacc[e] * b;
    m[g] = nm;
  };
  // The warp's token slots (lanes LPT apart hold the same dimensions of other tokens).
#pragma unroll
  for (int off = LPT; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      const float om = __shfl_xor_sync(0xffffffffu, m[g], off), ol = __shfl_xor_sync(0xffffffffu, l[g], off);
      float oacc[EPL];
#pragma unroll
      for (int e = 0; e < EPL; ++e) oacc[e] = __shfl_xor_sync(0xffffffffu, acc[g][e], off);
      merge(g, om, ol, oacc);
    }
  }
  // The warps, halving: the upper half hands its state to the lower half through shared memory.
  __shared__ float sm_m[WARPS / 2][GB], sm_l[WARPS / 2][GB], sm_acc[WARPS / 2][GB][D];
#pragma unroll
  for (int half = WARPS / 2; half >= 1; half >>= 1) {
    if (warp >= half && warp < 2 * half && slot == 0) {
#pragma unroll
      for (int g = 0; g < GB; ++g) {
        if (part == 0) {
          sm_m[warp - half][g] = m[g];
          sm_l[warp - half][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < EPL; ++e) sm_acc[warp - half][g][part * EPL + e] = acc[g][e];
      }
    }
    __syncthreads();
    if (warp < half) {
#pragma unroll
      for (int g = 0; g < GB; ++g) merge(g, sm_m[warp][g], sm_l[warp][g], &sm_acc[warp][g][part * EPL]);
    }
    __syncthreads();
  }
  if (warp == 0 && slot == 0) {
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      const size_t row = (size_t)(head0 + g) * NSPLIT + s;
      const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
#pragma unroll
      for (int e = 0; e < EPL; ++e) out[row * D + part * EPL + e] = acc[g][e] * inv;
      if (part == 0) lse[row] = l[g] > 0.f ? m[g] + logf(l[g]) : -INFINITY;
    }
  }
}

template <typename T, int D, int G, int GB, int NSPLIT, int SCALE_BITS>
__device__ void sala_decode_attention_split(
    const T* q, int64_t col, const T* k, const T* v, const T* kr, const T* vr, int kv_len, int settled, int cap, int rcap,
    float* out, float* lse) {
  sala_decode_attention_rows<T, T, D, G, GB, NSPLIT, SCALE_BITS, 0>(
      q, col, k, v, kr, vr, SalaKvScales<T>{}, kv_len, settled, cap, rcap, out, lse);
}

// The same over an 8-bit cache's codes (words [Hkv, cap, D / 4]) and their scales and biases.
template <typename T, int D, int G, int GB, int NSPLIT, int SCALE_BITS, int QGROUP>
__device__ void sala_decode_attention_split_q8(
    const T* q, int64_t col, const uint32_t* k, const uint32_t* v, const uint32_t* kr, const uint32_t* vr, SalaKvScales<T> qsb,
    int kv_len, int settled, int cap, int rcap, float* out, float* lse) {
  sala_decode_attention_rows<T, uint32_t, D, G, GB, NSPLIT, SCALE_BITS, QGROUP>(
      q, col, k, v, kr, vr, qsb, kv_len, settled, cap, rcap, out, lse);
}
