// The 4-bit core of the general kernel (qmv.cu) on tensor cores, for warps of 16 weight rows
// (bf16/f16 mma.sync, sm_80 and later). On the CUDA cores a 4-bit weight costs about four
// instructions (shift, mask, convert, multiply-add); here about two, and the multiply-adds go to
// the tensor cores. That alone did not make the products faster (both reach about half the
// memory bandwidth: eval/results/kernel-notes.md), so no default tiling takes this core yet.
//
// A warp's 16 weight rows are the m rows of an m16n8k16 product and its input rows the n
// columns. Lane (r, t) = (lane / 4, lane % 4) holds rows r and r + 8 and, as B, input row r. The
// 4 lanes of a row read its 16-byte chunks c0 + t (64 contiguous bytes, a "step"). A dot product
// does not care in which order it visits k, so the lane's k-slots of each mma stand for its own
// weights: from each packed word (8 weights, nibble i at bits 4i) one register holds the pair
// (i, i + 4) for i = 0..3, and the lane permutes its 8 input values to the same pairs. Weights
// become T exactly as 1 + q/16 (q in the top mantissa bits, one mask-and-or), then
// (v - 1) · 16s + b rounds once to T, as MLX's dequantize rounds them; products accumulate in float32.

// 1 + q/16 in T with the 4 bits of q at bit POS of each half (T's top 4 mantissa bits), and
// (v - 1) · s16 + b on a pair.
template <typename T> struct sala_q4_layout;
template <> struct sala_q4_layout<__nv_bfloat16> {
  static constexpr int POS = 3;
  static constexpr uint32_t ONES = 0x3F803F80u;
};
template <> struct sala_q4_layout<__half> {
  static constexpr int POS = 6;
  static constexpr uint32_t ONES = 0x3C003C00u;
};

__device__ __forceinline__ uint32_t sala_q4_affine(uint32_t v, uint32_t one, uint32_t s16, uint32_t b, __nv_bfloat16) {
  const __nv_bfloat162 q16 = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&v), *reinterpret_cast<__nv_bfloat162*>(&one));
  __nv_bfloat162 y = __hfma2(q16, *reinterpret_cast<__nv_bfloat162*>(&s16), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&y);
}

__device__ __forceinline__ uint32_t sala_q4_affine(uint32_t v, uint32_t one, uint32_t s16, uint32_t b, __half) {
  const __half2 q16 = __hsub2(*reinterpret_cast<__half2*>(&v), *reinterpret_cast<__half2*>(&one));
  __half2 y = __hfma2(q16, *reinterpret_cast<__half2*>(&s16), *reinterpret_cast<__half2*>(&b));
  return *reinterpret_cast<uint32_t*>(&y);
}

// Weights I and I + 4 of packed word w as a pair of T: (1 + q/16 - 1) · 16s + b, i.e. s · q + b
// rounded once (v - 1 is exact).
template <typename T, int I>
__device__ __forceinline__ uint32_t sala_q4_pair(uint32_t w, uint32_t s16, uint32_t b) {
  constexpr int POS = sala_q4_layout<T>::POS;
  constexpr uint32_t ONES = sala_q4_layout<T>::ONES;
  constexpr int SHIFT = 4 * I - POS;
  uint32_t moved;
  if constexpr (SHIFT >= 0) {
    moved = w >> SHIFT;
  } else {
    moved = w << -SHIFT;
  }
  return sala_q4_affine((moved & (0x000F000Fu << POS)) | ONES, ONES, s16, b, T());
}

// One T value in both halves of a register.
template <typename T>
__device__ __forceinline__ uint32_t sala_q4_both(T v) {
  const uint32_t bits = *reinterpret_cast<const unsigned short*>(&v);
  return bits | (bits << 16);
}

// The contract of sala_qmv_rows (qmv.cu) for BITS 4 and NR a multiple of 16: the NR output rows
// n[0..NR) (NR / 16 tiles) over the 16-byte chunks [c_begin, c_end), U steps of loads in flight,
// the sums in every lane's acc[m][r]. ROWS ≤ 8 (the n columns).
template <typename T, int GROUP, int ROWS, int NR, int U, typename Prepare>
__device__ __forceinline__ void sala_qmv_rows_mma(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const int (&n)[NR], int K,
    int c_begin, int c_end, Prepare prepare, float (&acc)[NR][ROWS]) {
  static_assert(NR % 16 == 0 && ROWS <= 8, "16 weight rows a tile, at most 8 input rows");
  constexpr int TILES = NR / 16;
  const int lane = threadIdx.x & 31, r = lane >> 2, t = lane & 3;
  const int chunks = K / 32, groups = K / GROUP;
  const uint4* rows[TILES][2];
  size_t scale_row[TILES][2];
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = n[16 * i + 8 * h + r];
      rows[i][h] = reinterpret_cast<const uint4*>(w) + (size_t)row * chunks;
      scale_row[i][h] = (size_t)row * groups;
    }
  float d[TILES][4];
#pragma unroll
  for (int i = 0; i < TILES; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[i][e] = 0.f;

  prepare();
  const uint4* xrow = reinterpret_cast<const uint4*>(x + (size_t)(r < ROWS ? r : 0) * K);
  const int steps = (c_end - c_begin + 3) / 4;
  for (int j0 = 0; j0 < steps; j0 += U) {
    uint4 packed[U][TILES][2];
    T sc[U][TILES][2], bi[U][TILES][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c_begin + 4 * (j0 + u) + t;
      const bool valid = j0 + u < steps && c < c_end;
#pragma unroll
      for (int i = 0; i < TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // A lane past the end gives zero weights (scale and bias 0).
          packed[u][i][h] = valid ? __ldg(rows[i][h] + c) : make_uint4(0, 0, 0, 0);
          const size_t g = scale_row[i][h] + c * 32 / GROUP;
          sc[u][i][h] = valid ? scales[g] : T(0.f);
          bi[u][i][h] = valid ? biases[g] : T(0.f);
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j0 + u >= steps) break;
      const int c = c_begin + 4 * (j0 + u) + t;
      // The lane's 32 input values as 16 registers of pairs (zero for rows past ROWS).
      uint32_t xv[16];
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint4 v = r < ROWS && c < c_end ? xrow[(size_t)c * 4 + l] : make_uint4(0, 0, 0, 0);
        xv[4 * l] = v.x; xv[4 * l + 1] = v.y; xv[4 * l + 2] = v.z; xv[4 * l + 3] = v.w;
      }
      uint32_t s16[TILES][2], b2[TILES][2];
#pragma unroll
      for (int i = 0; i < TILES; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          s16[i][h] = sala_q4_both<T>(T(16.f * static_cast<float>(sc[u][i][h])));
          b2[i][h] = sala_q4_both<T>(bi[u][i][h]);
        }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        // Input values 8m .. 8m + 7 as the pairs (i, i + 4).
        uint32_t xp[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          xp[2 * h] = __byte_perm(xv[4 * m + h], xv[4 * m + 2 + h], 0x5410);
          xp[2 * h + 1] = __byte_perm(xv[4 * m + h], xv[4 * m + 2 + h], 0x7632);
        }
#pragma unroll
        for (int i = 0; i < TILES; ++i) {
          const uint32_t w0[4] = {packed[u][i][0].x, packed[u][i][0].y, packed[u][i][0].z, packed[u][i][0].w};
          const uint32_t w1[4] = {packed[u][i][1].x, packed[u][i][1].y, packed[u][i][1].z, packed[u][i][1].w};
          const uint32_t lo[4] = {
              sala_q4_pair<T, 0>(w0[m], s16[i][0], b2[i][0]), sala_q4_pair<T, 1>(w0[m], s16[i][0], b2[i][0]),
              sala_q4_pair<T, 2>(w0[m], s16[i][0], b2[i][0]), sala_q4_pair<T, 3>(w0[m], s16[i][0], b2[i][0])};
          const uint32_t hi[4] = {
              sala_q4_pair<T, 0>(w1[m], s16[i][1], b2[i][1]), sala_q4_pair<T, 1>(w1[m], s16[i][1], b2[i][1]),
              sala_q4_pair<T, 2>(w1[m], s16[i][1], b2[i][1]), sala_q4_pair<T, 3>(w1[m], s16[i][1], b2[i][1])};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            // k-slots (2t, 2t + 1) take pair 2h, (2t + 8, 2t + 9) pair 2h + 1.
            const uint32_t a[4] = {lo[2 * h], hi[2 * h], lo[2 * h + 1], hi[2 * h + 1]};
            sala_mma(d[i], a, xp[2 * h], xp[2 * h + 1], T());
          }
        }
      }
    }
  }
  // d[i][2h + e] is weight row 16i + 8h + r, input row 2t + e: every lane gets every sum.
#pragma unroll
  for (int m = 0; m < NR; ++m)
#pragma unroll
    for (int q = 0; q < ROWS; ++q) {
      const int mm = m % 16;
      acc[m][q] = __shfl_sync(0xffffffffu, d[m / 16][(mm / 8) * 2 + (q & 1)], (mm % 8) * 4 + q / 2);
    }
}
