// A decoding token's query and key heads made ready for attention, in the stacked q/k/v
// projection's row, for a batch of sequences in one launch (the dense families' attention):
//   q and k heads:  x ← RMSNorm_D(x) · w   (Qwen3's q_norm / k_norm, when NORM)
//                   x ← x · mscale         (yarn's and longrope's attention factor, when not 1)
//                   RoPE (rotate-half) of the first DIMS dims at the sequence's position:
//                     angle_i = pos · POS_SCALE · inv_freq_i,  pair (i, i + DIMS/2)
//   other heads (the values): copied.
// Written as two arrays: the q heads [B, HQ, 1, D] as attention reads them, and the rest of the
// row [B, 1, W − HQ·D] (the keys, then the values) as the KV append reads it.
// inv_freq_i = 1 / periods[i] with a period table (TABLE), else 2^(−(i/(DIMS/2))·log₂base), as
// MLX's rope computes it. Each step's result is rounded to T, as MLX's rms_norm, multiply and
// rope each return T.
//
// One warp per head of D values, lane j holding values j, j + 32, …; 4 warps a thread block,
// grid (⌈heads/4⌉, B). The row is read through its strides (a view of the projection's output);
// positions come as the shape of a broadcast when POS_IN_SHAPE (kernels/custom.rs shape_args),
// else from an int array. Float constants come as their bit patterns (template ints).

template <typename T, int D, int DIMS, int HQ, int HKV, bool NORM, bool TABLE, int EPS_BITS, int MSCALE_BITS,
          int POS_SCALE_BITS, int LOG2_BASE_BITS, bool POS_IN_SHAPE, typename Dims, typename Strides>
__device__ void sala_rope_heads(
    const T* rows,              // [B, 1, W]
    const Strides& row_strides,
    const T* q_norm,            // [D] (NORM)
    const T* k_norm,            // [D] (NORM)
    const float* periods,       // [DIMS / 2] (TABLE)
    const int* positions,       // [B], unless POS_IN_SHAPE
    const Dims& position_dims,  // the positions + 1 when POS_IN_SHAPE
    T* q_out,                   // [B, HQ, 1, D]
    T* rest_out,                // [B, 1, W − HQ·D]
    int width) {
  static_assert(D % 32 == 0 && D <= 1024, "whole warps of values per head");
  constexpr int PER_LANE = D / 32;
  constexpr int HALF = DIMS / 2;
  __shared__ float xs[4][D];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = blockIdx.x * 4 + warp, b = blockIdx.y;
  if (head * D >= width) return;
  const int64_t col = row_strides[2];
  const T* row = rows + b * row_strides[0] + (int64_t)head * D * col;
  T* o = head < HQ ? q_out + ((size_t)b * HQ + head) * D : rest_out + (size_t)b * (width - HQ * D) + (size_t)(head - HQ) * D;

  float x[PER_LANE];
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) x[e] = static_cast<float>(row[(lane + 32 * e) * col]);
  if (head >= HQ + HKV) {
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) o[lane + 32 * e] = static_cast<T>(x[e]);
    return;
  }
  if (NORM) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) ss = fmaf(x[e], x[e], ss);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv_rms = rsqrtf(ss / D + __int_as_float(EPS_BITS));
    const T* w = head < HQ ? q_norm : k_norm;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) x[e] = sala_to_t<T>(static_cast<float>(w[lane + 32 * e]) * sala_to_t<T>(x[e] * inv_rms));
  }
  const float mscale = __int_as_float(MSCALE_BITS);
  if (mscale != 1.f) {
    const float m = sala_to_t<T>(mscale);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) x[e] = sala_to_t<T>(x[e] * m);
  }
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) xs[warp][lane + 32 * e] = x[e];
  __syncwarp();
  const float pos = static_cast<float>(POS_IN_SHAPE ? position_dims[b] - 1 : positions[b]) * __int_as_float(POS_SCALE_BITS);
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    const int j = lane + 32 * e;
    if (j < DIMS) {
      const int i = j < HALF ? j : j - HALF;
      const float inv_freq = TABLE ? 1.f / periods[i] : exp2f(-(static_cast<float>(i) / HALF) * __int_as_float(LOG2_BASE_BITS));
      float sn, cs;
      sincosf(pos * inv_freq, &sn, &cs);
      x[e] = j < HALF ? x[e] * cs - xs[warp][j + HALF] * sn : x[e] * cs + xs[warp][j - HALF] * sn;
    }
    o[j] = static_cast<T>(x[e]);
  }
}
