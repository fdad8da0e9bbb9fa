// Prompt products in FP8 (e4m3) on Hopper's warpgroup tensor cores (wgmma, sm_90a): y = x · Wᵀ with
// x and W each rounded to e4m3 under one scale a row, x ≈ xs[m] · xq[m, :] and W ≈ ws[n] · wq[n, :]:
//   y[m, n] = xs[m] · ws[n] · Σ_k xq[m, k] · wq[n, k],
// the sum in float32 on the tensor cores, the two scales applied once an output. A row's largest
// magnitude maps to e4m3's largest finite value, 448. Not the exact product: opt-in
// (docs/architecture.md, Prompt products in FP8).

constexpr float SALA_E4M3_MAX = 448.f;

// Two floats to e4m3 (to nearest even, saturating), `lo` in the low byte.
__device__ __forceinline__ uint32_t sala_e4m3x2(float lo, float hi) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The largest of every thread's v in a block of whole warps (at most 32 of them).
__device__ inline float sala_block_max(float v) {
  __shared__ float warp_max[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v = fmaxf(v, warp_max[w]);
  return v;
}

// Where byte k of row `row` of an e4m3 matrix of K columns goes. TILE_ROWS = 0: row-major
// [rows, K]. Otherwise the tiles a block of sala_gemm_e4m3_bulk copies whole: tiles of TILE_ROWS
// rows by 128 bytes (K padded to a multiple of 128, rows to a multiple of TILE_ROWS, with zeros),
// the tiles of a band of rows one after another, and within a tile each row's 16-byte chunk c at
// chunk c ^ (row mod 8): the image of shared memory that wgmma reads with the 128-byte swizzle.
template <int TILE_ROWS>
__device__ __forceinline__ size_t sala_e4m3_offset(size_t row, int k, int K) {
  if constexpr (TILE_ROWS == 0) {
    return row * K + k;
  } else {
    const int k_tiles = (K + 127) / 128;
    const int r = (int)(row % TILE_ROWS), c = (k & 127) >> 4;
    return ((row / TILE_ROWS) * k_tiles + (k >> 7)) * (TILE_ROWS * 128) + r * 128 + ((c ^ (r & 7)) << 4) + (k & 15);
  }
}

// sala_rows_to_e4m3: x [R, K] (T) → q (e4m3 bytes, laid out as sala_e4m3_offset<TILE_ROWS> says)
// and s [R] float32, one block a row (and one a padding row of a tiled q, which it fills with
// zeros), 16 bytes of x a thread a step. K a multiple of 16.
template <typename T, int TILE_ROWS>
__device__ inline void sala_rows_to_e4m3(const T* x, int R, int K, uint8_t* q, float* s) {
  constexpr int VEC = 16 / sizeof(T);
  const int padded_k = TILE_ROWS == 0 ? K : (K + 127) / 128 * 128;
  const size_t row = blockIdx.x;
  const bool live = row < (size_t)R;
  const T* xr = x + row * K;
  float amax = 0.f;
  if (live) {
    for (int k = threadIdx.x * VEC; k < K; k += blockDim.x * VEC) {
      const uint4 packed = *reinterpret_cast<const uint4*>(xr + k);
      const T* v = reinterpret_cast<const T*>(&packed);
#pragma unroll
      for (int i = 0; i < VEC; ++i) amax = fmaxf(amax, fabsf(static_cast<float>(v[i])));
    }
  }
  amax = sala_block_max(amax);
  const float inv = amax > 0.f ? SALA_E4M3_MAX / amax : 0.f;
  for (int k = threadIdx.x * VEC; k < padded_k; k += blockDim.x * VEC) {
    uint32_t words[VEC / 4] = {};
    if (live && k < K) {
      const uint4 packed = *reinterpret_cast<const uint4*>(xr + k);
      const T* v = reinterpret_cast<const T*>(&packed);
#pragma unroll
      for (int w = 0; w < VEC / 4; ++w)
        words[w] = sala_e4m3x2(static_cast<float>(v[4 * w]) * inv, static_cast<float>(v[4 * w + 1]) * inv) |
                   (sala_e4m3x2(static_cast<float>(v[4 * w + 2]) * inv, static_cast<float>(v[4 * w + 3]) * inv) << 16);
    }
    uint8_t* dst = q + sala_e4m3_offset<TILE_ROWS>(row, k, K);
    if constexpr (VEC == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
    else *reinterpret_cast<uint32_t*>(dst) = words[0];
  }
  if (live && threadIdx.x == 0) s[row] = amax / SALA_E4M3_MAX;
}

// sala_quantized_to_e4m3: an MLX BITS-bit matrix (packed [N, K · BITS / 32] words, scales and
// biases [N, K / GROUP] in T; a weight is scale · q + bias) → wq (e4m3 bytes as
// sala_e4m3_offset<TILE_ROWS> lays them out) and ws [N] float32, one block a row (and one a padding
// row of a tiled wq). A row's largest magnitude is taken over its groups' ends, bias and
// scale · (2^BITS − 1) + bias, where MLX's quantization puts the group's extremes.
template <typename T, int GROUP, int BITS, int TILE_ROWS>
__device__ inline void sala_quantized_to_e4m3(const uint32_t* packed, const T* scales, const T* biases, int N, int K, uint8_t* wq, float* ws) {
  static_assert(BITS == 4 || BITS == 8, "4 or 8 bits");
  static_assert(GROUP * BITS >= 128, "a thread's 16 bytes of words lie in one group");
  constexpr int PER_WORD = 32 / BITS, PER_CHUNK = 4 * PER_WORD, MASK = (1 << BITS) - 1;
  const int padded_k = TILE_ROWS == 0 ? K : (K + 127) / 128 * 128;
  const size_t row = blockIdx.x;
  const bool live = row < (size_t)N;
  const int groups = K / GROUP;
  const T* sr = scales + row * groups;
  const T* br = biases + row * groups;
  float amax = 0.f;
  for (int g = threadIdx.x; live && g < groups; g += blockDim.x) {
    const float scale = static_cast<float>(sr[g]), bias = static_cast<float>(br[g]);
    amax = fmaxf(amax, fmaxf(fabsf(bias), fabsf(fmaf(scale, (float)MASK, bias))));
  }
  amax = sala_block_max(amax);
  const float inv = amax > 0.f ? SALA_E4M3_MAX / amax : 0.f;
  const uint4* words = reinterpret_cast<const uint4*>(packed + row * (K / PER_WORD));
  for (int c = threadIdx.x; c < padded_k / PER_CHUNK; c += blockDim.x) {
    uint32_t out[PER_CHUNK / 4] = {};
    if (live && c < K / PER_CHUNK) {
      const uint4 chunk = words[c];
      const uint32_t w[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
      const int g = c * PER_CHUNK / GROUP;
      const float scale = static_cast<float>(sr[g]), bias = static_cast<float>(br[g]);
#pragma unroll
      for (int i = 0; i < PER_CHUNK / 4; ++i) {
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int e = 4 * i + j;
          v[j] = fmaf(scale, (float)((w[e / PER_WORD] >> (BITS * (e % PER_WORD))) & MASK), bias) * inv;
        }
        out[i] = sala_e4m3x2(v[0], v[1]) | (sala_e4m3x2(v[2], v[3]) << 16);
      }
    }
#pragma unroll
    for (int i = 0; i < PER_CHUNK / 16; ++i)
      *reinterpret_cast<uint4*>(wq + sala_e4m3_offset<TILE_ROWS>(row, c * PER_CHUNK + 16 * i, K)) =
          make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
  }
  if (live && threadIdx.x == 0) ws[row] = amax / SALA_E4M3_MAX;
}

// One m64n256k32 step of a warpgroup: d (64 × 256 float32, in the mma fragment order of 16-row
// warps) += A (64 × 32 e4m3) · B (256 × 32 e4m3)ᵀ, both read from shared memory through their
// descriptors (the accumulators start at zero; scale-d is always 1).
__device__ __forceinline__ void sala_wgmma_e4m3(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},"
      " %128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(1));
}

// The accumulators of a block's warpgroup (its thread `tid` of 256) scaled and stored: y[m, n] =
// d · xs[m] · ws[n] for the block's outputs at (m0, n0) inside M × N. Fragment order: warp w of
// the warpgroup holds rows 16w + lane / 4 (+ 8); register 4j + e is column 8j + 2 (lane % 4) +
// (e & 1), the upper row for e ≥ 2.
template <typename T, int BN>
__device__ inline void sala_gemm_e4m3_store(const float (&d)[BN / 2], const float* xs, const float* ws, int M, int N, T* y, int m0, int n0, int tid) {
  const int lane = tid & 31, warp = (tid >> 5) & 3, warpgroup = tid >> 7;
  const int row0 = m0 + warpgroup * 64 + warp * 16 + (lane >> 2);
  const float scale_top = row0 < M ? xs[row0] : 0.f, scale_bottom = row0 + 8 < M ? xs[row0 + 8] : 0.f;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int n = n0 + 8 * j + 2 * (lane & 3);
    if (n >= N) continue;
    const bool pair = n + 1 < N;
    const float w0 = ws[n], w1 = pair ? ws[n + 1] : 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = row0 + 8 * h;
      if (m >= M) continue;
      const float sx = h ? scale_bottom : scale_top;
      const float v0 = d[4 * j + 2 * h] * sx * w0, v1 = d[4 * j + 2 * h + 1] * sx * w1;
      if (pair) *reinterpret_cast<uint32_t*>(y + (size_t)m * N + n) = sala_pack(v0, v1, T());
      else y[(size_t)m * N + n] = static_cast<T>(v0);
    }
  }
}

// sala_gemm_e4m3: y [M, N] (T) = xs · ws · (xq · wqᵀ) for xq [M, K] and wq [N, K] e4m3 bytes, xs
// [M] and ws [N] float32. Blocks of 256 threads (two warpgroups) take 128 × BN outputs, each
// warpgroup 64 rows of them, over k tiles of 128 bytes in a ring of STAGES filled by cp.async
// STAGES − 2 tiles ahead: the stage refilled is the one read two tiles ago, which every
// warpgroup's wgmma has finished by the barrier. K a multiple of 16, N even; rows past M or N
// read zeros. Dynamic shared memory: STAGES · (128 + BN) · 128 bytes, and 1024 for aligning the
// stages to the swizzle's atoms.
template <typename T, int BN, int STAGES>
__device__ inline void sala_gemm_e4m3(const uint8_t* xq, const float* xs, const uint8_t* wq, const float* ws, int M, int N, int K, T* y) {
  static_assert(BN == 256 && STAGES >= 3, "the wgmma shape written out, and a ring of 3 or more");
  constexpr int BM = 128, BK = 128;
  constexpr int A_BYTES = BM * BK, STAGE_BYTES = (BM + BN) * BK;
  extern __shared__ __align__(16) unsigned char sala_dynamic_shared[];
  const uint32_t shared_base = (sala_shared_address(sala_dynamic_shared) + 1023) & ~1023u;
  unsigned char* const base = sala_dynamic_shared + (shared_base - sala_shared_address(sala_dynamic_shared));
  const int tid = threadIdx.x, warpgroup = tid >> 7;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int tiles = (K + BK - 1) / BK;

  // Chunk c of a tile: row c / 8, 16 bytes at column (c % 8) · 16, stored swizzled.
  auto load = [&](int stage, int tile) {
    unsigned char* a = base + stage * STAGE_BYTES;
    unsigned char* b = a + A_BYTES;
#pragma unroll
    for (int i = 0; i < (BM + BN) * BK / 16 / 256; ++i) {
      const int c = tid + 256 * i;
      const bool in_a = c < BM * BK / 16;
      const int row = in_a ? c >> 3 : (c - BM * BK / 16) >> 3, col = c & 7;
      const int k = tile * BK + col * 16;
      const int outer = in_a ? m0 + row : n0 + row, outer_end = in_a ? M : N;
      const bool valid = outer < outer_end && k < K;
      const uint8_t* src = (in_a ? xq : wq) + (valid ? (size_t)outer * K + k : 0);
      sala_cp_async16((in_a ? a : b) + row * 128 + ((col ^ (row & 7)) << 4), src, valid);
    }
  };

  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < tiles) load(s, s);
    asm volatile("cp.async.commit_group;");
  }
  for (int tile = 0; tile < tiles; ++tile) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 3));
    // This thread's copies, made by the generic proxy, become visible to wgmma's async proxy.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const uint32_t a = shared_base + (tile % STAGES) * STAGE_BYTES + warpgroup * 64 * BK;
    const uint32_t b = shared_base + (tile % STAGES) * STAGE_BYTES + A_BYTES;
    sala_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 32; ++ks) sala_wgmma_e4m3(d, sala_wgmma_descriptor(a + 32 * ks), sala_wgmma_descriptor(b + 32 * ks));
    sala_wgmma_commit();
    // The copies go out while the tensor cores work.
    if (tile + STAGES - 2 < tiles) load((tile + STAGES - 2) % STAGES, tile + STAGES - 2);
    asm volatile("cp.async.commit_group;");
    sala_wgmma_wait<1>(d);
  }
  sala_wgmma_wait<0>(d);
  asm volatile("cp.async.wait_group 0;");

  sala_gemm_e4m3_store<T, BN>(d, xs, ws, M, N, y, m0, n0, tid);
}

__device__ __forceinline__ void sala_mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void sala_mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nSALA_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra SALA_WAIT;\n}" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void sala_mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// `bytes` of global memory into shared memory by the copy engine, counted on `bar`'s transaction.
__device__ __forceinline__ void sala_bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes),
               "r"(bar) : "memory");
}

// sala_gemm_e4m3_bulk: sala_gemm_e4m3 for xq and wq in the tiled layouts of sala_e4m3_offset (x in
// tiles of 128 rows, W of BN): a stage's two tiles are two contiguous copies, so one thread of a
// ninth warp (the producer) fills a ring of STAGES with bulk copies counted on the stage's `full`
// barrier, and the two warpgroups only multiply; each warpgroup's first thread frees a stage on
// its `empty` barrier once the wgmma reading it has completed. No barrier spans the block.
// Blocks of 288 threads; dynamic shared memory STAGES · (128 + BN) · 128 + 1024 + 16 · STAGES.
template <typename T, int BN, int STAGES>
__device__ inline void sala_gemm_e4m3_bulk(const uint8_t* xq, const float* xs, const uint8_t* wq, const float* ws, int M, int N, int K, T* y) {
  static_assert(BN == 256, "the wgmma shape written out");
  constexpr int BM = 128, BK = 128;
  constexpr int A_BYTES = BM * BK, B_BYTES = BN * BK, STAGE_BYTES = A_BYTES + B_BYTES;
  extern __shared__ __align__(16) unsigned char sala_dynamic_shared[];
  const uint32_t shared_base = (sala_shared_address(sala_dynamic_shared) + 1023) & ~1023u;
  const uint32_t full = shared_base + STAGES * STAGE_BYTES, empty = full + 8 * STAGES;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int m_tile = blockIdx.y, n_tile = blockIdx.x;
  const int k_tiles = (K + BK - 1) / BK;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      sala_mbarrier_init(full + 8 * s, 1);
      sala_mbarrier_init(empty + 8 * s, 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 8) {
    if ((tid & 31) == 0) {
      const uint8_t* a_src = xq + (size_t)m_tile * k_tiles * A_BYTES;
      const uint8_t* b_src = wq + (size_t)n_tile * k_tiles * B_BYTES;
      for (int tile = 0; tile < k_tiles; ++tile) {
        const int s = tile % STAGES, round = tile / STAGES;
        if (round > 0) sala_mbarrier_wait(empty + 8 * s, (round - 1) & 1);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full + 8 * s), "r"(STAGE_BYTES) : "memory");
        sala_bulk_copy(shared_base + s * STAGE_BYTES, a_src + (size_t)tile * A_BYTES, A_BYTES, full + 8 * s);
        sala_bulk_copy(shared_base + s * STAGE_BYTES + A_BYTES, b_src + (size_t)tile * B_BYTES, B_BYTES, full + 8 * s);
      }
    }
    return;
  }
  const int warpgroup = tid >> 7;
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
  for (int tile = 0; tile < k_tiles; ++tile) {
    const int s = tile % STAGES;
    sala_mbarrier_wait(full + 8 * s, (tile / STAGES) & 1);
    const uint32_t a = shared_base + s * STAGE_BYTES + warpgroup * 64 * BK;
    const uint32_t b = shared_base + s * STAGE_BYTES + A_BYTES;
    sala_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 32; ++ks) sala_wgmma_e4m3(d, sala_wgmma_descriptor(a + 32 * ks), sala_wgmma_descriptor(b + 32 * ks));
    sala_wgmma_commit();
    sala_wgmma_wait<1>(d);
    // The previous tile's wgmma has completed: its stage may be refilled.
    if (tile > 0 && (tid & 127) == 0) sala_mbarrier_arrive(empty + 8 * ((tile - 1) % STAGES));
  }
  sala_wgmma_wait<0>(d);
  sala_gemm_e4m3_store<T, BN>(d, xs, ws, M, N, y, m_tile * BM, n_tile * BN, tid);
}
