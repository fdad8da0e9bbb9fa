// Quantized matrix-vector product for decode (a few rows of input), plain or with the SwiGLU or
// residual step that follows it fused in:
//   y[r, n] = sum_k x[r, k] * (scale[n, g] * q[n, k] + bias[n, g]),   g = k / GROUP
// with MLX's packing: BITS-bit values little-endian in uint32 words, groups of GROUP along k.
//
// One warp per NR output rows; each lane streams 16-byte chunks of the packed rows (16 weights at
// 8 bits, 32 at 4), U chunks of each row in flight, and the warp reduces at the end. Weight bytes are read once;
// x is small and stays in L1/L2 and is read 16 bytes at a time. Quantized values become floats
// through the exponent trick (0x4B000000 | q is the float 2^23 + q, sala_q_plus_2p23), which is
// cheaper than an integer conversion. Accumulation is float32. 4-bit warps of 16 rows in 16-bit types take the
// tensor-core core of qmv_rows_mma.cu instead (sala_qmv_rows below chooses). Needs unpack.cu
// (sala_load8), mma.cu (sala_shared_address, sala_mma), qmv_rows_mma.cu and round.cu (the epilogues).
//
// The chunks reach the lane in one of two ways. In registers (ASYNC false): the lane asks for U
// chunks, uses them, then asks for the next U, so its loads come in bursts and each one in flight
// holds registers. Through shared memory (ASYNC true): cp.async copies land in a ring of U slots
// per lane, and the lane asks for chunk j + U - 1 before it uses chunk j, so U - 1 chunks are
// always in flight and hold no registers (an 8-bit product is bound by the bytes each SM keeps
// in flight, not by its instructions: eval/results/2026-11-24-h100-4dbf8a3). Each lane reads back
// only the slots it filled, so the ring needs no barrier; a normed product asks for its first
// chunks before it normalises x.

// One 16-byte cp.async, bypassing L1; the "memory" clobbers (here and on the commits and waits)
// keep the compiler from moving the ring's reads across them.
__device__ __forceinline__ void sala_qmv_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sala_shared_address(dst)), "l"(src) : "memory");
}

// The schedule of a cp.async ring of U slots (slot u holds the steps j ≡ u (mod U)), shared by
// the kernels that stream their weights through one: request(j, slot) issues the copies of step j
// (called only for j < count), each followed by one commit group, empty past the last step, so
// that the wait counts the same way for every step; prepare() runs once the first U - 1 steps
// are on their way; use(j, slot) runs once step j has landed, with U - 1 later steps in flight.
template <int U, typename Request, typename Prepare, typename Use>
__device__ __forceinline__ void sala_ring_schedule(int count, Request request, Prepare prepare, Use use) {
  auto issue = [&](int j, int slot) {
    if (j < count) request(j, slot);
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
#pragma unroll
  for (int j = 0; j < U - 1; ++j) issue(j, j);
  prepare();
  for (int j0 = 0; j0 < count; j0 += U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u;
      if (j >= count) break;
      issue(j + U - 1, (u + U - 1) % U);
      asm volatile("cp.async.wait_group %0;" ::"n"(U - 1) : "memory");
      use(j, u);
    }
  }
}

// A ring slot's R weight rows (one 16-byte chunk of each, per lane) with their scales and
// biases, which wait in registers: the request and use halves of a ring's steps. group_of(m, c)
// is the index of the scale and bias of chunk c of row m.
template <typename T, int U, int R, typename GroupOf>
__device__ __forceinline__ void sala_ring_copy(uint4 (&ring)[U][R][32], T (&sr)[U][R], T (&br)[U][R], int slot,
                                               const uint4* const (&rows)[R], int c, const T* scales,
                                               const T* biases, GroupOf group_of) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < R; ++m) {
    sala_qmv_copy16(&ring[slot][m][lane], rows[m] + c);
    sr[slot][m] = scales[group_of(m, c)];
    br[slot][m] = biases[group_of(m, c)];
  }
}

template <typename T, int U, int R>
__device__ __forceinline__ void sala_ring_read(const uint4 (&ring)[U][R][32], const T (&sr)[U][R], const T (&br)[U][R],
                                               int slot, uint4 (&packed)[R], float (&s)[R], float (&b)[R]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < R; ++m) {
    packed[m] = ring[slot][m][lane];
    s[m] = static_cast<float>(sr[slot][m]);
    b[m] = static_cast<float>(br[slot][m]);
  }
}

// Value i of the BITS-bit values packed little-endian in words, as the float 2^23 + q (the
// exponent trick): one byte permute at 8 bits, where shift, mask and or take three instructions.
template <int BITS>
__device__ __forceinline__ float sala_q_plus_2p23(const uint32_t* words, int i) {
  constexpr int PER_WORD = 32 / BITS;
  if constexpr (BITS == 8) {
    // Result bytes: byte i % 4 of the word, then 0x00, 0x00 and 0x4B from the constant.
    return __uint_as_float(__byte_perm(words[i / PER_WORD], 0x4B000000u, 0x7440u + i % PER_WORD));
  } else {
    return __uint_as_float(0x4B000000u | ((words[i / PER_WORD] >> ((i % PER_WORD) * BITS)) & ((1u << BITS) - 1u)));
  }
}

// The 8 values of a word of 4-bit weights as exact floats, two at a time (PAIRS). One LOP3 puts
// the nibbles i and i + 4 into the low mantissa bits of a half2 whose exponent makes each
// (B + q) exact: nibbles at bits 0-3 of each half over B = 1024 (ulp 1), at bits 4-7 over B = 64
// (ulp 1/16, so 16q reads as q); one shift by 8 brings nibbles 2, 3, 6, 7 there. A half2
// subtraction leaves (q_i, q_{i+4}) exactly, and each half converts to float. About 0.6 ALU
// instructions a weight where sala_q_plus_2p23's shift, mask and or take two, and the 4-bit
// products are bound by the ALU pipe (eval/results/2026-11-29-h200-decode-bound); the values,
// so the sums, are the same bits.
template <uint32_t MASK, uint32_t BASE>
__device__ __forceinline__ void sala_q4_pair(uint32_t bits, float& lo, float& hi) {
  // (bits & MASK) | BASE in one LOP3 (truth table 0xEA); the compiler otherwise makes it two.
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(bits), "n"(MASK), "n"(BASE));
  const uint32_t base = BASE;
  const __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&base));
  lo = __low2float(q);
  hi = __high2float(q);
}

__device__ __forceinline__ void sala_q4_unpack_word(uint32_t word, float* q) {
  const uint32_t upper = word >> 8;
  sala_q4_pair<0x000F000Fu, 0x64006400u>(word, q[0], q[4]);
  sala_q4_pair<0x00F000F0u, 0x54005400u>(word, q[1], q[5]);
  sala_q4_pair<0x000F000Fu, 0x64006400u>(upper, q[2], q[6]);
  sala_q4_pair<0x00F000F0u, 0x54005400u>(upper, q[3], q[7]);
}

// The warp's sums over the 16-byte chunks [c_begin, c_end) of the NR output rows n[0..NR) of
// every input row, reduced into every lane's acc, on the CUDA cores. Each x chunk is loaded once
// for all NR rows (x traffic from L1/L2 had capped the one-row form below the memory bandwidth:
// q4 ran no faster than q8). prepare() runs once before x is read (the normed products write x there; every thread
// of the block calls it), after the first copies are on their way when ASYNC.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int U, bool ASYNC, bool PAIRS, typename Prepare>
__device__ __forceinline__ void sala_qmv_rows_fma(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const int (&n)[NR], int K,
    int c_begin, int c_end, Prepare prepare, float (&acc)[NR][ROWS]) {
  constexpr int PER_CHUNK = 128 / BITS;       // weights per 16-byte chunk
  const int lane = threadIdx.x & 31;
  const int chunks = K / PER_CHUNK;
  const int groups = K / GROUP;
  const uint4* rows[NR];
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    rows[m] = reinterpret_cast<const uint4*>(w) + (size_t)n[m] * chunks;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.f;
  }

  // Chunk c of every row, with its group's scale s and bias b.
  auto consume = [&](const uint4 (&packed)[NR], const float (&s)[NR], const float (&b)[NR], int c) {
    const int k0 = c * PER_CHUNK;
    // Each row's weights dequantized once, then used for every input row.
    float q[NR][PER_CHUNK];
#pragma unroll
    for (int m = 0; m < NR; ++m) {
      const uint32_t words[4] = {packed[m].x, packed[m].y, packed[m].z, packed[m].w};
      if constexpr (BITS == 4 && PAIRS) {
#pragma unroll
        for (int v = 0; v < 4; ++v) sala_q4_unpack_word(words[v], q[m] + 8 * v);
      } else {
#pragma unroll
        for (int i = 0; i < PER_CHUNK; ++i) {
          q[m][i] = sala_q_plus_2p23<BITS>(words, i) - 8388608.f;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float xv[PER_CHUNK];
#pragma unroll
      for (int i = 0; i < PER_CHUNK; i += 8) sala_load8(x + (size_t)r * K + k0 + i, xv + i);
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < PER_CHUNK; ++i) sum += xv[i];
#pragma unroll
      for (int m = 0; m < NR; ++m) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < PER_CHUNK; ++i) dot = fmaf(xv[i], q[m][i], dot);
        acc[m][r] = fmaf(s[m], dot, fmaf(b[m], sum, acc[m][r]));
      }
    }
  };
  // Index of the scale and bias of chunk c of row m.
  auto group_of = [&](int m, int c) { return (size_t)n[m] * groups + c * PER_CHUNK / GROUP; };

  if constexpr (ASYNC) {
    // The lane's chunks c_begin + lane + 32 j of every row through the ring (sala_ring_schedule);
    // their scales and biases wait in registers (the schedule unrolls its slots, so they are
    // known at compile time).
    __shared__ __align__(16) uint4 ring[WARPS][U][NR][32];
    const int warp = threadIdx.x >> 5;
    const int first = c_begin + lane;
    const int count = first < c_end ? (c_end - first + 31) / 32 : 0;
    T sr[U][NR], br[U][NR];
    auto request = [&](int j, int slot) {
      sala_ring_copy(ring[warp], sr, br, slot, rows, first + 32 * j, scales, biases, group_of);
    };
    auto use = [&](int j, int slot) {
      uint4 packed[NR];
      float s[NR], b[NR];
      sala_ring_read(ring[warp], sr, br, slot, packed, s, b);
      consume(packed, s, b, first + 32 * j);
    };
    sala_ring_schedule<U>(count, request, prepare, use);
  } else {
    prepare();
    auto consume_loaded = [&](const uint4 (&packed)[NR], int c) {
      float s[NR], b[NR];
#pragma unroll
      for (int m = 0; m < NR; ++m) {
        s[m] = static_cast<float>(scales[group_of(m, c)]);
        b[m] = static_cast<float>(biases[group_of(m, c)]);
      }
      consume(packed, s, b, c);
    };
    int c = c_begin + lane;
    for (; c + 32 * (U - 1) < c_end; c += 32 * U) {  // U chunks of every row in flight
      uint4 packed[U][NR];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < NR; ++m) packed[u][m] = __ldg(rows[m] + c + 32 * u);
#pragma unroll
      for (int u = 0; u < U; ++u) consume_loaded(packed[u], c + 32 * u);
    }
    for (; c < c_end; c += 32) {
      uint4 last[NR];
#pragma unroll
      for (int m = 0; m < NR; ++m) last[m] = __ldg(rows[m] + c);
      consume_loaded(last, c);
    }
  }

#pragma unroll
  for (int m = 0; m < NR; ++m) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);
    }
  }
}

// The core every form below calls: 4-bit warps of 16 weight rows in 16-bit types take the
// tensor cores (qmv_rows_mma.cu), the rest the CUDA cores' multiply-adds above.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int U, bool ASYNC, bool PAIRS, typename Prepare>
__device__ __forceinline__ void sala_qmv_rows(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const int (&n)[NR], int K,
    int c_begin, int c_end, Prepare prepare, float (&acc)[NR][ROWS]) {
  if constexpr (BITS == 4 && NR % 16 == 0 && sizeof(T) == 2) {
    sala_qmv_rows_mma<T, GROUP, ROWS, NR, U>(x, w, scales, biases, n, K, c_begin, c_end, prepare, acc);
  } else {
    sala_qmv_rows_fma<T, BITS, GROUP, ROWS, WARPS, NR, U, ASYNC, PAIRS>(x, w, scales, biases, n, K, c_begin, c_end, prepare, acc);
  }
}

// prepare() for products whose x is ready as it is.
struct sala_qmv_ready {
  __device__ void operator()() const {}
};

// The first of the NR consecutive output rows this warp computes, SPLIT warps sharing them.
template <int WARPS, int SPLIT, int NR>
__device__ __forceinline__ int sala_qmv_first_row() { return (blockIdx.x * (WARPS / SPLIT) + (threadIdx.x >> 5) / SPLIT) * NR; }

// sala_qmv_rows with SPLIT warps sharing each group of NR output rows, each over a 1/SPLIT of K
// (their sums meet in shared memory): a matrix of few rows then still has enough warps, each
// with few loads one after another, to keep the memory busy. The warp's output rows are n[];
// returns whether this warp holds the whole sums (the first of its SPLIT).
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS, typename Prepare>
__device__ __forceinline__ bool sala_qmv_rows_split(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const int (&n)[NR], int K, Prepare prepare,
    float (&acc)[NR][ROWS]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int part = warp % SPLIT;
  const int chunks = K / (128 / BITS), per = (chunks + SPLIT - 1) / SPLIT;
  sala_qmv_rows<T, BITS, GROUP, ROWS, WARPS, NR, U, ASYNC, PAIRS>(
      x, w, scales, biases, n, K, part * per, min(chunks, (part + 1) * per), prepare, acc);
  if (SPLIT > 1) {
    __shared__ float partial[WARPS][NR][ROWS];
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < NR; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) partial[warp][m][r] = acc[m][r];
    }
    __syncthreads();
    if (part != 0) return false;
#pragma unroll
    for (int p = 1; p < SPLIT; ++p)
#pragma unroll
      for (int m = 0; m < NR; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[m][r] += partial[warp + p][m][r];
  }
  return true;
}

// y = residual + alpha · (x · Wᵀ), rounded as the separate operations round it; x · Wᵀ when
// residual is null. alpha comes as the bit pattern of its value in T (a model constant: read
// from an array the host wrote, it cost the GPU a managed-memory fault per launch). SPLIT warps
// share each group of NR output rows (sala_qmv_rows_split).
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS, int ALPHA_BITS,
          typename Prepare = sala_qmv_ready>
__device__ __forceinline__ void sala_qmv_residual(
    const T* x, const uint32_t* w, const T* scales, const T* biases, const T* residual, T* y, int N, int K,
    Prepare prepare = {}) {
  const int n0 = sala_qmv_first_row<WARPS, SPLIT, NR>();
  int n[NR];
#pragma unroll
  for (int m = 0; m < NR; ++m) n[m] = min(n0 + m, N - 1);
  float acc[NR][ROWS];
  const bool whole = sala_qmv_rows_split<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS>(x, w, scales, biases, n, K, prepare, acc);
  if (!whole || n0 >= N || (threadIdx.x & 31) != 0) return;
  const float a = __int_as_float(ALPHA_BITS);
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    if (n0 + m >= N) break;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const size_t i = (size_t)r * N + n0 + m;
      y[i] = residual == nullptr
          ? static_cast<T>(acc[m][r])
          : sala_residual_add<T>(residual[i], a, acc[m][r]);
    }
  }
}

// y = x · Wᵀ, W [N, K]: the residual form above without a residual.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS>
__device__ __forceinline__ void sala_qmv(
    const T* x, const uint32_t* w, const T* scales, const T* biases, T* y, int N, int K) {
  sala_qmv_residual<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, 0>(x, w, scales, biases, nullptr, y, N, K);
}

// SwiGLU of a stacked [gate; up] matrix W [2F, K]: y[r, n] = silu(g) · u for g, u the products with
// rows n and F + n, each intermediate rounded to T as the separate operations round it. A warp
// takes NR / 2 gate rows and their up rows; SPLIT warps share them (sala_qmv_rows_split).
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS,
          typename Prepare = sala_qmv_ready>
__device__ __forceinline__ void sala_qmv_swiglu(
    const T* x, const uint32_t* w, const T* scales, const T* biases, T* y, int F, int K, Prepare prepare = {}) {
  constexpr int HALF = NR / 2;
  // Warps past the last row compute the last row again and store nothing (prepare() may hold
  // barriers that every thread must reach).
  const int n0 = sala_qmv_first_row<WARPS, SPLIT, HALF>();
  int n[NR];
#pragma unroll
  for (int m = 0; m < HALF; ++m) {
    n[m] = min(n0 + m, F - 1);
    n[HALF + m] = F + n[m];
  }
  float acc[NR][ROWS];
  const bool whole = sala_qmv_rows_split<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS>(x, w, scales, biases, n, K, prepare, acc);
  if (!whole || (threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int m = 0; m < HALF; ++m) {
    if (n0 + m >= F) break;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      y[(size_t)r * F + n0 + m] = sala_swiglu<T>(acc[m][r], acc[HALF + m][r]);
    }
  }
}


// RMSNorm of the ROWS input rows (K wide) folded into the product: the thread block normalises x
// into shared memory once, rounded as MLX's rms_norm rounds it, w · T(x · rsqrt(mean(x²) + eps)),
// and its warps read x from there (a decode step had one small normalisation kernel before each
// of these products, 65 of them, each costing a launch and the host's work for an operation).
// With a gate, each normalised value is then multiplied by T(σ(z)), z from gate + r · gate_stride
// (rounded as sala_norm_gate in lightning_decode.cu rounds it).
template <typename T, int ROWS, int K>
__device__ __forceinline__ void sala_rms_norm_stage(
    const T* x, const T* norm, float eps, T* xs, const T* gate = nullptr, int gate_stride = 0) {
  static_assert(K % 8 == 0, "whole 8-element pieces");
  __shared__ float partial[ROWS][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float ss = 0.f;
    for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {
      float v[8];
      sala_load8(x + (size_t)r * K + k, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss = fmaf(v[i], v[i], ss);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) partial[r][warp] = ss;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float ss = 0.f;
    for (int w = 0; w < warps; ++w) ss += partial[r][w];
    const float inv = rsqrtf(ss / K + eps);
    for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {
      float v[8], g[8], z[8];
      sala_load8(x + (size_t)r * K + k, v);
      sala_load8(norm + k, g);
      if (gate != nullptr) sala_load8(gate + (size_t)r * gate_stride + k, z);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float y = sala_to_t<T>(g[i] * sala_to_t<T>(v[i] * inv));
        xs[r * K + k + i] = static_cast<T>(gate == nullptr ? y : y * sala_to_t<T>(1.f / (1.f + expf(-z[i]))));
      }
    }
  }
  __syncthreads();
}

// y = RMSNorm(x) · Wᵀ (the plain product of sala_qmv_residual on the normalised rows).
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS, int K, int EPS_BITS>
__device__ void sala_qmv_normed(
    const T* x, const T* norm, const uint32_t* w, const T* scales, const T* biases, T* y, int N) {
  __shared__ __align__(16) T xs[ROWS * K];
  auto prepare = [&] { sala_rms_norm_stage<T, ROWS, K>(x, norm, __int_as_float(EPS_BITS), xs); };
  sala_qmv_residual<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, 0>(xs, w, scales, biases, nullptr, y, N, K, prepare);
}

// y = SwiGLU of RMSNorm(x) · [W_gate; W_up]ᵀ.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS, int K, int EPS_BITS>
__device__ void sala_qmv_swiglu_normed(
    const T* x, const T* norm, const uint32_t* w, const T* scales, const T* biases, T* y, int F) {
  __shared__ __align__(16) T xs[ROWS * K];
  auto prepare = [&] { sala_rms_norm_stage<T, ROWS, K>(x, norm, __int_as_float(EPS_BITS), xs); };
  sala_qmv_swiglu<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS>(xs, w, scales, biases, y, F, K, prepare);
}

// y = residual + alpha · (RMSNorm(x) ⊙ σ(z)) · Wᵀ: a lightning layer's output norm and gate folded
// into its o_proj (one small kernel fewer per layer and step); z is the K columns at Z_OFF of each
// row of gate_src, W wide.
template <typename T, int BITS, int GROUP, int ROWS, int WARPS, int NR, int SPLIT, int U, bool ASYNC, bool PAIRS, int ALPHA_BITS, int K,
          int EPS_BITS, int Z_OFF>
__device__ void sala_qmv_residual_norm_gated(
    const T* x, const T* norm, const T* gate_src, int W, const uint32_t* w, const T* scales, const T* biases,
    const T* residual, T* y, int N) {
  __shared__ __align__(16) T xs[ROWS * K];
  auto prepare = [&] { sala_rms_norm_stage<T, ROWS, K>(x, norm, __int_as_float(EPS_BITS), xs, gate_src + Z_OFF, W); };
  sala_qmv_residual<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, ALPHA_BITS>(xs, w, scales, biases, residual, y, N, K, prepare);
}
