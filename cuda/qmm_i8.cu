// The 8-bit prompt product on int8 tensor cores (mma.sync m16n8k32, sm_80 and later): y = x · Wᵀ
// for many rows of x (a prompt chunk) and an MLX 8-bit matrix W = s · q + b (q unsigned, one
// scale and bias per GROUP weights of a row). The bf16 product dequantizes W in registers and
// runs at bf16 tensor-core speed; int8 tensor cores do twice the multiply-adds a cycle, if x is
// 8-bit too. So x is quantized first, per row and GROUP: x ≈ xs · xq with xs = max|x| / 127, and
//   y[m, n] = Σ_g xs[m, g] · s[n, g] · Σ_{k∈g} xq[m, k] · q[n, k]  +  Σ_g (Σ_{k∈g} x[m, k]) · b[n, g].
// The inner sums are exact in int32; each group's is scaled into a float32 sum. The bias term is
// a product of the group sums of x (as two 16-bit values, high and low part) with the biases, on
// the 16-bit tensor cores at the end. Only x's rounding to 8 bits departs from the exact product.

// sala_quantize_rows_i8: x [rows, K] in T → xq [rows, K] int8, xs [rows, K / GROUP] float32 and
// the groups' sums of x as sum_hi + sum_lo [rows, K / GROUP] in T. Eight values a thread, GROUP / 8
// threads a group (shuffles within them).
template <typename T, int GROUP>
__device__ inline void sala_quantize_rows_i8(const T* x, size_t groups_total, int8_t* xq, float* xs, T* sum_hi, T* sum_lo) {
  static_assert(GROUP % 8 == 0 && GROUP / 8 <= 32 && ((GROUP / 8) & (GROUP / 8 - 1)) == 0, "8 to 256 values a group, a power of two");
  constexpr int LANES = GROUP / 8;
  const size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t group = thread / LANES;
  const bool live = group < groups_total;
  // Every lane of a warp takes part in the shuffles; those past the end hold zeros.
  float v[8];
  if (live) {
    const uint4 packed = reinterpret_cast<const uint4*>(x)[thread];
    const T* h = reinterpret_cast<const T*>(&packed);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(h[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.f;
  }
  float amax = 0.f, sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    sum += v[i];
  }
#pragma unroll
  for (int o = 1; o < LANES; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  if (!live) return;
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  uint32_t word[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = max(-127, min(127, __float2int_rn(v[4 * w + i] * inv)));
      packed |= (uint32_t)(q & 0xff) << (8 * i);
    }
    word[w] = packed;
  }
  reinterpret_cast<uint2*>(xq)[thread] = make_uint2(word[0], word[1]);
  if (thread % LANES == 0) {
    xs[group] = amax / 127.f;
    const T hi = static_cast<T>(sum);
    sum_hi[group] = hi;
    sum_lo[group] = static_cast<T>(sum - static_cast<float>(hi));
  }
}

__device__ inline void sala_mma_i8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An int32 sum of magnitude below 2^22 added to the bits of 1.5 · 2^23 is that float plus the
// sum: the accumulators start at these bits, and a group's sum becomes a float with one
// subtraction instead of a conversion (conversions run at an eighth of the float rate).
constexpr int SALA_I8_MAGIC = 0x4B400000;
constexpr float SALA_I8_MAGIC_F = 12582912.f;

// 16-byte chunk c of row r of a tile of 64-byte rows, swizzled so that the 8 rows an ldmatrix
// reads at one chunk fall in 8 different bank groups.
__device__ __forceinline__ int sala_i8_slot(int r, int c) { return r * 64 + ((c ^ ((r >> 1) & 3)) << 4); }

// sala_qmm_i8: y [M, N] (T) = the product above for xq [M, K] int8, xs [M, K / GROUP], sum_hi and
// sum_lo [M, K / GROUP] (T), w [N, K / 4] (four 8-bit weights a word), scales and biases
// [N, K / GROUP] (T). Blocks of 256 threads take 128 × 128 outputs over k tiles of 64 bytes in a
// ring of 3 (cp.async); warps 2 × 4, each 64 × 32 outputs. K a multiple of 64.
template <typename T, int GROUP>
__device__ inline void sala_qmm_i8(const int8_t* xq, const float* xs, const T* sum_hi, const T* sum_lo, const uint32_t* w,
                                   const T* scales, const T* biases, int M, int N, int K, T* y) {
  static_assert(GROUP == 32 || GROUP == 64 || GROUP == 128, "MLX's group sizes");
  constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3;
  __shared__ __align__(128) unsigned char a_tile[STAGES][BM * BK];
  __shared__ __align__(128) unsigned char b_tile[STAGES][BN * BK];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const int r = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int groups = K / GROUP, tiles = K / BK;
  const unsigned char* wb = reinterpret_cast<const unsigned char*>(w);
  const unsigned char* xb = reinterpret_cast<const unsigned char*>(xq);

  // Each thread copies 2 chunks of A and 2 of B a tile.
  auto load = [&](int stage, int tile) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int chunk = tid + 256 * i, row = chunk >> 2, c = chunk & 3;
      const int m = m0 + row, n = n0 + row;
      const size_t k = (size_t)tile * BK + 16 * c;
      sala_cp_async16(a_tile[stage] + sala_i8_slot(row, c), xb + (size_t)min(m, M - 1) * K + k, m < M);
      sala_cp_async16(b_tile[stage] + sala_i8_slot(row, c), wb + (size_t)min(n, N - 1) * K + k, n < N);
    }
    asm volatile("cp.async.commit_group;");
  };

  float acc[4][4][4];
  int sums[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[i][j][e] = 0.f;
        sums[i][j][e] = SALA_I8_MAGIC;
      }
  // The rows and columns whose scales this thread applies: row mi · 16 + h · 8 + r, column
  // ni · 8 + 2t + e of the warp's tile (clamped inside the matrix; what lies outside is not stored).
  int rows[4][2], cols[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rows[i][h] = min(m0 + warp_m * 64 + i * 16 + h * 8 + r, M - 1);
      cols[i][h] = min(n0 + warp_n * 32 + i * 8 + 2 * t + h, N - 1);
    }

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles) load(s, s);
    else asm volatile("cp.async.commit_group;");
  }
  for (int tile = 0; tile < tiles; ++tile) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
    __syncthreads();
    // The next tile's copy goes into the stage read two tiles ago, which every warp has finished.
    if (tile + STAGES - 1 < tiles) load((tile + STAGES - 1) % STAGES, tile + STAGES - 1);
    else asm volatile("cp.async.commit_group;");
    const unsigned char* a_s = a_tile[tile % STAGES];
    const unsigned char* b_s = b_tile[tile % STAGES];
#pragma unroll
    for (int ks = 0; ks < BK / 32; ++ks) {
      uint32_t a[4][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) sala_ldmatrix_x4(a[i], a_s + sala_i8_slot(warp_m * 64 + i * 16 + (lane & 15), 2 * ks + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t d[4];
        sala_ldmatrix_x4(d, b_s + sala_i8_slot(warp_n * 32 + j * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
        b[2 * j][0] = d[0]; b[2 * j][1] = d[1];
        b[2 * j + 1][0] = d[2]; b[2 * j + 1][1] = d[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sala_mma_i8(sums[i][j], a[i], b[j][0], b[j][1]);
      const int done = tile * BK + (ks + 1) * 32;
      if (done % GROUP == 0) {
        // A group is complete: its sums, scaled, join the float sums.
        const int g = done / GROUP - 1;
        float sx[4][2], sw[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            sx[i][h] = __ldg(xs + (size_t)rows[i][h] * groups + g);
            sw[i][h] = static_cast<float>(scales[(size_t)cols[i][h] * groups + g]);
          }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float sum = __int_as_float(sums[i][j][e]) - SALA_I8_MAGIC_F;
              acc[i][j][e] = fmaf(sx[i][e >> 1] * sw[j][e & 1], sum, acc[i][j][e]);
              sums[i][j][e] = SALA_I8_MAGIC;
            }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;");

  // The bias term: (sum_hi + sum_lo) [rows, groups] times biases [cols, groups]ᵀ, 16 groups an mma.
  for (int g0 = 0; g0 < groups; g0 += 16) {
    uint32_t bb[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int g = g0 + 2 * t + 8 * h;
        const int n = min(n0 + warp_n * 32 + j * 8 + r, N - 1);
        bb[j][h] = g < groups ? *reinterpret_cast<const uint32_t*>(biases + (size_t)n * groups + g) : 0u;
      }
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      const T* sums_of = part == 0 ? sum_hi : sum_lo;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t aa[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int g = g0 + 2 * t + 8 * (q >> 1);
          aa[q] = g < groups ? *reinterpret_cast<const uint32_t*>(sums_of + (size_t)rows[i][q & 1] * groups + g) : 0u;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) sala_mma(acc[i][j], aa, bb[j][0], bb[j][1], T());
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + warp_m * 64 + i * 16 + h * 8 + r;
      if (m >= M) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + warp_n * 32 + j * 8 + 2 * t;
        if (n + 1 < N) {
          *reinterpret_cast<uint32_t*>(y + (size_t)m * N + n) = sala_pack(acc[i][j][2 * h], acc[i][j][2 * h + 1], T());
        } else if (n < N) {
          y[(size_t)m * N + n] = static_cast<T>(acc[i][j][2 * h]);
        }
      }
    }
}
