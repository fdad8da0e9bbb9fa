// A decoding token's query, key and value heads from the stacked q/k/v projection's row, made
// ready for attention and written where attention reads them, for a batch of sequences in one
// launch (the dense families' attention):
//   q and k heads:  x ← RMSNorm_D(x) · w   (Qwen3's q_norm / k_norm, when NORM)
//                   x ← x · mscale         (yarn's and longrope's attention factor, when not 1)
//                   RoPE (rotate-half) of the first DIMS dims at the sequence's position:
//                     angle_i = pos · POS_SCALE · inv_freq_i,  pair (i, i + DIMS/2)
//   v heads:        as they are.
// The q heads go to q_out [B, 1, HQ·D]; the k and v heads go behind the sequence's recent tokens
// (engine::cache::SeqBuffer): position `at` of new copies of its recent-key and recent-value
// buffers [HKV, rcap, D], whose positions before `at` the same launch copies over. Positions
// after `at` are not written: nothing reads a buffer past its fill. One launch instead of a RoPE
// launch and a KV-append launch: a decode step is bound by the host's work per launch.
// inv_freq_i = 1 / periods[i] with a period table (TABLE), else 2^(−(i/(DIMS/2))·log₂base), as
// MLX's rope computes it. Each step's result is rounded to T, as MLX's rms_norm, multiply and
// rope each return T. sala_rope_prompt, at the end, makes a prompt chunk's heads the same way and
// writes them in the head-major layout attention and GLA read (MLX: a slice, norm, transpose and
// rope each for q and k and a copy of v, every layer of every chunk).
//
// Thread blocks of 4 warps, grid (head blocks + copy blocks, B): in the first
// ⌈(HQ + 2·HKV)/4⌉ blocks (kernels/rope.rs launches as many) one warp per head of D values, lane j holding values j, j + 32, …; the
// rest copy the earlier recent tokens, 16 bytes a thread. The row is read through its column
// stride (a view of the projection's output). Float constants come as their bit patterns
// (template ints).

// One head of D values read through its column stride, lane j holding values j, j + 32, …:
// copied as it is (a v head), or (a q or k head) through the norm, the attention factor and RoPE
// by the angles' cos and sin (sala_rope_angles; xs: the warp's D floats of shared memory for the
// rotation's partners).
template <typename T, int D>
__device__ __forceinline__ void sala_copy_head(const T* x_in, int64_t col, T* o, int lane) {
#pragma unroll
  for (int e = 0; e < D / 32; ++e) o[lane + 32 * e] = x_in[(int64_t)(lane + 32 * e) * col];
}

template <typename T, int D, int DIMS, bool NORM, int EPS_BITS, int MSCALE_BITS>
__device__ __forceinline__ void sala_rope_head(
    const T* x_in, int64_t col, const T* norm, const float* cs, const float* sn, float* xs, T* o, int lane) {
  static_assert(D % 32 == 0 && D <= 1024, "whole warps of values per head");
  constexpr int PER_LANE = D / 32;
  constexpr int HALF = DIMS / 2;
  float x[PER_LANE];
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) x[e] = static_cast<float>(x_in[(int64_t)(lane + 32 * e) * col]);
  if (NORM) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) ss = fmaf(x[e], x[e], ss);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv_rms = rsqrtf(ss / D + __int_as_float(EPS_BITS));
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) x[e] = sala_to_t<T>(static_cast<float>(norm[lane + 32 * e]) * sala_to_t<T>(x[e] * inv_rms));
  }
  const float mscale = __int_as_float(MSCALE_BITS);
  if (mscale != 1.f) {
    const float m = sala_to_t<T>(mscale);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) x[e] = sala_to_t<T>(x[e] * m);
  }
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) xs[lane + 32 * e] = x[e];
  __syncwarp();
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    const int j = lane + 32 * e;
    if (j < DIMS) {
      const int i = j < HALF ? j : j - HALF;
      x[e] = j < HALF ? x[e] * cs[i] - xs[j + HALF] * sn[i] : x[e] * cs[i] + xs[j - HALF] * sn[i];
    }
    o[j] = static_cast<T>(x[e]);
  }
}

// The rotation's cos and sin of each of the DIMS / 2 pairs at `position`, into the block's shared
// cs and sn (every head of a block is one token's): the block's threads share the work, and the
// caller syncs the block before its heads read them.
template <int DIMS, bool TABLE, int POS_SCALE_BITS, int LOG2_BASE_BITS>
__device__ __forceinline__ void sala_rope_angles(const float* periods, int position, float* cs, float* sn) {
  constexpr int HALF = DIMS / 2;
  const float pos = static_cast<float>(position) * __int_as_float(POS_SCALE_BITS);
  for (int i = threadIdx.x; i < HALF; i += blockDim.x) {
    const float inv_freq = TABLE ? 1.f / periods[i] : exp2f(-(static_cast<float>(i) / HALF) * __int_as_float(LOG2_BASE_BITS));
    sincosf(pos * inv_freq, &sn[i], &cs[i]);
  }
}

template <int HQ, int HKV>
__host__ __device__ constexpr int sala_rope_head_blocks() { return (HQ + 2 * HKV + 3) / 4; }

template <typename T, int D, int DIMS, int HQ, int HKV, bool NORM, bool TABLE, int EPS_BITS, int MSCALE_BITS,
          int POS_SCALE_BITS, int LOG2_BASE_BITS>
__device__ void sala_rope_append(
    const T* row,               // this sequence's row of the projection
    int64_t col,                // its column stride
    const T* q_norm,            // [D] (NORM)
    const T* k_norm,            // [D] (NORM)
    const float* periods,       // [DIMS / 2] (TABLE)
    int position,               // the token's position
    const T* k_recent,          // [HKV, rcap, D] the recent keys before this token
    const T* v_recent,          // [HKV, rcap, D] the recent values
    int rcap, int at,           // the buffers' capacity; the token's place in them
    T* q_out,                   // this sequence's [HQ · D]
    T* k_out, T* v_out) {       // [HKV, rcap, D] the recent buffers with the token
  constexpr int HEAD_BLOCKS = sala_rope_head_blocks<HQ, HKV>();
  if ((int)blockIdx.x >= HEAD_BLOCKS) {
    constexpr int VEC = 16 / sizeof(T);
    static_assert(D % VEC == 0, "whole 16-byte pieces per head");
    constexpr int PER_POS = D / VEC;
    const int n = 2 * HKV * at * PER_POS;
    const int stride = (gridDim.x - HEAD_BLOCKS) * blockDim.x;
    for (int i = (blockIdx.x - HEAD_BLOCKS) * blockDim.x + threadIdx.x; i < n; i += stride) {
      const int c = i % PER_POS, p = (i / PER_POS) % at, hv = i / PER_POS / at;
      const int h = hv % HKV;
      const size_t off = ((size_t)h * rcap + p) * D + (size_t)c * VEC;
      const T* from = hv < HKV ? k_recent : v_recent;
      T* to = hv < HKV ? k_out : v_out;
      *reinterpret_cast<uint4*>(to + off) = *reinterpret_cast<const uint4*>(from + off);
    }
    return;
  }
  __shared__ float xs[4][D];
  __shared__ float cs[DIMS / 2 + 1], sn[DIMS / 2 + 1];
  sala_rope_angles<DIMS, TABLE, POS_SCALE_BITS, LOG2_BASE_BITS>(periods, position, cs, sn);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = blockIdx.x * 4 + warp;
  if (head >= HQ + 2 * HKV) return;
  T* o = head < HQ            ? q_out + (size_t)head * D
         : head < HQ + HKV    ? k_out + ((size_t)(head - HQ) * rcap + at) * D
                              : v_out + ((size_t)(head - HQ - HKV) * rcap + at) * D;
  const T* x_in = row + (int64_t)head * D * col;
  if (head >= HQ + HKV) {
    sala_copy_head<T, D>(x_in, col, o, lane);
  } else {
    sala_rope_head<T, D, DIMS, NORM, EPS_BITS, MSCALE_BITS>(x_in, col, head < HQ ? q_norm : k_norm, cs, sn, xs[warp], o, lane);
  }
}

// A prompt chunk's heads, for attention or GLA over many tokens: the stacked projection's rows
// [B, T, ≥ (HQ + 2·HKV)·D] (read through their strides) → q [B, HQ, T, D], k and v [B, HKV, T, D],
// q and k normed and rotated as above (DIMS 0: not rotated), token t of sequence b at
// positions[b] + t (positions[0] for all when npos is 1). Grid (head blocks, T, B), 4 warps a
// block, a warp per head of a token.
template <typename T, int D, int DIMS, int HQ, int HKV, bool NORM, bool TABLE, int EPS_BITS, int MSCALE_BITS,
          int POS_SCALE_BITS, int LOG2_BASE_BITS>
__device__ void sala_rope_prompt(
    const T* rows, int64_t batch_stride, int64_t token_stride, int64_t col, const T* q_norm, const T* k_norm,
    const float* periods, const int32_t* positions, int npos, int tokens, T* q_out, T* k_out, T* v_out) {
  __shared__ float xs[4][D];
  __shared__ float cs[DIMS / 2 + 1], sn[DIMS / 2 + 1];
  const int t = blockIdx.y, b = blockIdx.z;
  sala_rope_angles<DIMS, TABLE, POS_SCALE_BITS, LOG2_BASE_BITS>(periods, positions[npos == 1 ? 0 : b] + t, cs, sn);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = blockIdx.x * 4 + warp;
  if (head >= HQ + 2 * HKV) return;
  const T* x_in = rows + b * batch_stride + t * token_stride + (int64_t)head * D * col;
  if (head >= HQ + HKV) {
    sala_copy_head<T, D>(x_in, col, v_out + (((size_t)b * HKV + head - HQ - HKV) * tokens + t) * D, lane);
    return;
  }
  T* o = head < HQ ? q_out + (((size_t)b * HQ + head) * tokens + t) * D : k_out + (((size_t)b * HKV + head - HQ) * tokens + t) * D;
  sala_rope_head<T, D, DIMS, NORM, EPS_BITS, MSCALE_BITS>(x_in, col, head < HQ ? q_norm : k_norm, cs, sn, xs[warp], o, lane);
}
