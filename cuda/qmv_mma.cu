// Quantized matrix product for decode on tensor cores (bf16/f16 mma.sync, sm_80 and later): the
// product of cuda/qmv.cu for 1–64 input rows, y = x · Wᵀ with W in MLX's affine layout, plain or
// with its SwiGLU or residual epilogue. Uses mma.cu and the epilogues of round.cu.
//
// Each m16n8k16 product takes 8 weight rows as its n columns and 16 input rows as its m rows,
// so its cost hardly depends on how many input rows there are (one sequence or a decode batch);
// past 16 rows each dequantized weight fragment feeds one product per 16-row tile of the input,
// so the weights are still read once.
// Lane (r, t) = (lane / 4, lane % 4) reads 16 bytes of weight row r (16 weights at 8 bits, 32 at
// 4); the 4 lanes of a row read 64 contiguous bytes, a "step". A dot product does not care in
// which order it visits k, so the lane's k-slots {2t, 2t+1, 2t+8, 2t+9} of mma k-step j stand
// for its own weights 4j .. 4j+3 in both operands: the weights need no shuffling, and the input
// row's matching values are one contiguous load. Weights are dequantized to T (as MLX's
// dequantize rounds them) and accumulated in float32.
//
// A thread block owns NT tiles of 8 weight rows (SwiGLU: NT / 2 gate tiles and their up tiles)
// and splits K over its WARPS warps, which take interleaved steps; the warps' partial sums meet
// in shared memory. WARPS is chosen so that small matrices still fill the GPU with loads. The
// weights reach the registers in one of two ways, as in qmv.cu: register loads, U steps asked for
// at once (ASYNC false), or a cp.async ring of U steps per warp that keeps U - 1 in flight at all
// times and leaves L1 to the input rows (ASYNC true).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "sala_qmm needs mma.sync for bf16/f16 (compute capability 8.0 or later)"
#endif

// 16 bytes of packed weights with scale s and bias b as T pairs: frag[p] = (w[2p], w[2p + 1]).
template <typename T, int BITS>
__device__ __forceinline__ void sala_qmm_dequant(const uint4& packed, float s, float b, uint32_t (&frag)[64 / BITS]) {
  const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
  for (int p = 0; p < 64 / BITS; ++p) {
    float q[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) q[e] = sala_q_plus_2p23<BITS>(words, 2 * p + e) - 8388608.f;
    frag[p] = sala_pack(fmaf(s, q[0], b), fmaf(s, q[1], b), T());
  }
}

// EPI: 0 plain (y = x · Wᵀ), 1 residual (y = residual + alpha · x · Wᵀ, alpha the bit pattern of
// its value in T, as in qmv.cu), 2 SwiGLU of the stacked
// [gate; up] W of 2F rows (y = silu(x · W_gateᵀ) ⊙ x · W_upᵀ, F wide). HALVES: 8-row halves of
// 16-row tiles the input rows take (1, 2, 4 or 8).
template <typename T, int BITS, int GROUP, int HALVES, int WARPS, int NT, int U, bool ASYNC, int EPI, int ALPHA_BITS>
__device__ void sala_qmm(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const T* residual, T* y, int rows, int N, int K) {
  constexpr int PER_CHUNK = 128 / BITS;     // weights per 16-byte load
  constexpr int KSTEPS = PER_CHUNK / 4;     // mma k-steps per load
  constexpr int X_LOADS = PER_CHUNK * sizeof(T) / 16;
  constexpr int OUT_TILES = EPI == 2 ? NT / 2 : NT;
  constexpr int MT = (HALVES + 1) / 2;      // 16-row tiles of input rows
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = lane >> 2, t = lane & 3;
  const int width = EPI == 2 ? N / 2 : N;  // y's row length
  const int o0 = blockIdx.x * 8 * OUT_TILES;
  const int chunks = K / PER_CHUNK, steps = chunks / 4, groups = K / GROUP;

  const uint4* wrow[NT];
  int wr[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int out = min(o0 + 8 * (i % OUT_TILES) + r, width - 1);
    wr[i] = out + (EPI == 2 && i >= OUT_TILES ? width : 0);
    wrow[i] = reinterpret_cast<const uint4*>(w) + (size_t)wr[i] * chunks;
  }
  // Input row 16 m + r (lo) and 16 m + 8 + r (hi) of tile m.
  bool has_lo[MT], has_hi[MT];
  const uint4* x_lo[MT];
  const uint4* x_hi[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int lo = 16 * m + r, hi = lo + 8;
    has_lo[m] = lo < rows;
    has_hi[m] = 2 * m + 1 < HALVES && hi < rows;
    x_lo[m] = reinterpret_cast<const uint4*>(x + (size_t)min(lo, rows - 1) * K);
    x_hi[m] = reinterpret_cast<const uint4*>(x + (size_t)min(hi, rows - 1) * K);
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][i][e] = 0.f;

  // The lane's input values of chunk c for tile m's two halves.
  auto load_x = [&](int m, int c, uint32_t (&xl)[4 * X_LOADS], uint32_t (&xh)[4 * X_LOADS]) {
#pragma unroll
    for (int l = 0; l < X_LOADS; ++l) {
      const uint4 a = has_lo[m] ? __ldg(x_lo[m] + (size_t)c * X_LOADS + l) : make_uint4(0, 0, 0, 0);
      const uint4 b = has_hi[m] ? __ldg(x_hi[m] + (size_t)c * X_LOADS + l) : make_uint4(0, 0, 0, 0);
      xl[4 * l] = a.x; xl[4 * l + 1] = a.y; xl[4 * l + 2] = a.z; xl[4 * l + 3] = a.w;
      xh[4 * l] = b.x; xh[4 * l + 1] = b.y; xh[4 * l + 2] = b.z; xh[4 * l + 3] = b.w;
    }
  };
  auto multiply = [&](float (&into)[4], const uint32_t (&xl)[4 * X_LOADS], const uint32_t (&xh)[4 * X_LOADS],
                      const uint32_t (&frag)[64 / BITS]) {
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j) {
      const uint32_t a[4] = {xl[2 * j], xh[2 * j], xl[2 * j + 1], xh[2 * j + 1]};
      sala_mma(into, a, frag[2 * j], frag[2 * j + 1], T());
    }
  };
  // One 64-byte step: the lane's chunk c of every weight tile, dequantized once, against each
  // tile of input rows. One input tile keeps its values in registers across the weight tiles;
  // several read theirs again per weight tile (from L1), which holds fewer registers.
  auto consume = [&](const uint4 (&packed)[NT], const float (&sc)[NT], const float (&bi)[NT], int c) {
    uint32_t xl[4 * X_LOADS], xh[4 * X_LOADS];
    if constexpr (MT == 1) load_x(0, c, xl, xh);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      uint32_t frag[64 / BITS];
      sala_qmm_dequant<T, BITS>(packed[i], sc[i], bi[i], frag);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if constexpr (MT > 1) load_x(m, c, xl, xh);
        multiply(acc[m][i], xl, xh, frag);
      }
    }
  };
  auto group_of = [&](int i, int c) { return (size_t)wr[i] * groups + c * PER_CHUNK / GROUP; };

  if constexpr (ASYNC) {
    // The warp's steps warp + WARPS j through the ring (sala_ring_schedule, sala_ring_copy and
    // sala_ring_read in qmv.cu). Each lane reads back only the chunks it copied, so the ring needs
    // no barrier.
    __shared__ __align__(16) uint4 ring[WARPS][U][NT][32];
    T sr[U][NT], br[U][NT];
    const int count = warp < steps ? (steps - warp + WARPS - 1) / WARPS : 0;
    auto request = [&](int j, int slot) {
      sala_ring_copy(ring[warp], sr, br, slot, wrow, 4 * (warp + WARPS * j) + t, scales, biases, group_of);
    };
    auto use = [&](int j, int slot) {
      uint4 packed[NT];
      float sc[NT], bi[NT];
      sala_ring_read(ring[warp], sr, br, slot, packed, sc, bi);
      consume(packed, sc, bi, 4 * (warp + WARPS * j) + t);
    };
    sala_ring_schedule<U>(count, request, [] {}, use);
  } else {
    for (int s0 = warp; s0 < steps; s0 += WARPS * U) {
      uint4 packed[U][NT];
      float sc[U][NT], bi[U][NT];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = 4 * (s0 + u * WARPS) + t;
        if (s0 + u * WARPS < steps) {
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            packed[u][i] = __ldg(wrow[i] + c);
            sc[u][i] = static_cast<float>(scales[group_of(i, c)]);
            bi[u][i] = static_cast<float>(biases[group_of(i, c)]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (s0 + u * WARPS >= steps) break;
        consume(packed[u], sc[u], bi[u], 4 * (s0 + u * WARPS) + t);
      }
    }
  }

  if (WARPS > 1) {
    __shared__ float partial[WARPS][MT][NT][4][32];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) partial[warp][m][i][e][lane] = acc[m][i][e];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int v = 1; v < WARPS; ++v)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][i][e] += partial[v][m][i][e][lane];
  }

  // acc[m][i][2h + e] is input row 16m + 8h + r, output 2t + e of tile i.
  const float a = __int_as_float(ALPHA_BITS);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * m + 8 * h + r;
      if (2 * m + h >= HALVES || row >= rows) break;
#pragma unroll
      for (int i = 0; i < OUT_TILES; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int o = o0 + 8 * i + 2 * t + e;
          if (o >= width) continue;
          const size_t at = (size_t)row * width + o;
          const float v = acc[m][i][2 * h + e];
          if (EPI == 0) {
            y[at] = static_cast<T>(v);
          } else if (EPI == 1) {
            y[at] = sala_residual_add<T>(residual[at], a, v);
          } else {
            y[at] = sala_swiglu<T>(v, acc[m][OUT_TILES + i][2 * h + e]);
          }
        }
      }
    }
  }
}
