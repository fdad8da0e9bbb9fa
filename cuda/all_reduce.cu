// Tensor parallelism's sum over the GPUs of one host, in one kernel through peer memory (CUDA
// IPC): a decoding token needs dozens of small sums, and NCCL's all-reduce inside a graph costs
// tens of µs each (src/kernels/all_reduce.rs). Each rank owns an exchange buffer that every other rank has mapped, in regions (one
// per size class of sums, from REGION_AT on), each laid out as:
//   [0, 4·MAX_BLOCKS)            counts[b]: how many sums this rank's thread block b has begun
//   then flags[b][r]             written by rank r: the count its block b has reached
//   from SALA_AR_DATA_AT on      data[slot][r]: rank r's piece of the input, SLOT_BYTES each
// A call's thread block b (the same element range on every rank) pushes its part of x into every
// peer's data[slot][RANK], raises flags[b][RANK] on every peer to its count, waits until each
// peer's flag in its own buffer has reached that count, then sums the ranks' parts in rank order
// (float32, rounded once to T), so every rank gets the same values. Two slots, alternating by the
// count: a rank writes a slot again only after every peer has raised its flag for the next sum,
// which it does once its whole previous sum (every block) is done. That needs:
// - the sums of a region to run one after another in the same order on every rank: MLX runs the
//   kernels of a graph concurrently where no data links them, so each sum takes the previous one's
//   `ticket` as an input (src/kernels/all_reduce.rs);
// - every block of a region to be at the same count, so that all use one slot: each region's sums
//   are launched with the same number of blocks.
// A peer that never arrives (killed) stops this one by a trap after SALA_AR_PATIENCE_NS; in the
// check at start (CHECKING) the wait ends after SALA_AR_CHECK_PATIENCE_NS instead, marking the
// buffer's word SALA_AR_TIMED_OUT (of region 0) for the host to read.

#define SALA_AR_MAX_BLOCKS 128
#define SALA_AR_MAX_RANKS 8
#define SALA_AR_TIMED_OUT 2047
#define SALA_AR_DATA_AT 8192
#define SALA_AR_PATIENCE_NS 300000000000ull
#define SALA_AR_CHECK_PATIENCE_NS 20000000000ull

__device__ __forceinline__ void sala_ar_release(uint32_t* flag, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t sala_ar_acquire(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ unsigned long long sala_ar_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// y = Σ_r x_r over the RANKS ranks for x and y of n values; table[r] is rank r's exchange buffer
// as mapped in this process, its region for these sums at REGION_AT. Whole 16-byte pieces are
// split between the thread blocks; the last block also takes the values after them. `ticket`
// gets a value only for the order it makes.
template <typename T, int RANKS, int RANK, int REGION_AT, int SLOT_BYTES, bool CHECKING>
__device__ void sala_all_sum(const T* x, const unsigned long long* table, T* y, uint32_t* ticket, size_t n) {
  static_assert(RANKS >= 2 && RANKS <= SALA_AR_MAX_RANKS && RANK < RANKS, "2 to 8 ranks");
  static_assert(SLOT_BYTES % 16 == 0, "whole pieces in a slot");
  static_assert(SALA_AR_TIMED_OUT >= SALA_AR_MAX_BLOCKS * (1 + SALA_AR_MAX_RANKS) && SALA_AR_TIMED_OUT < SALA_AR_DATA_AT / 4, "a word of its own in the header");
  constexpr int VEC = 16 / sizeof(T);
  // Rank r's region of this size class.
  auto region = [&](int r) { return reinterpret_cast<unsigned char*>(table[r]) + REGION_AT; };
  unsigned char* own = region(RANK);
  uint32_t* counts = reinterpret_cast<uint32_t*>(own);
  const int b = blockIdx.x;
  if (gridDim.x > SALA_AR_MAX_BLOCKS) __trap();  // the launch's grid disagrees with the header
  __shared__ uint32_t count;
  if (threadIdx.x == 0) count = counts[b] + 1, counts[b] = count;
  __syncthreads();
  const uint32_t mine = count;
  const size_t slot = mine & 1u;
  if (b == 0 && threadIdx.x == 0) ticket[0] = mine;
  // This block's pieces, and the values past the last piece: the same on every rank.
  const size_t pieces = n / VEC, per = (pieces + gridDim.x - 1) / gridDim.x;
  const size_t first = min(pieces, b * per), last = min(pieces, first + per);
  const bool tail = b == gridDim.x - 1;
  const size_t rest = pieces * VEC + threadIdx.x;  // this thread's value past the pieces, if < n
  auto part = [&](unsigned char* buffer, int rank) {
    return buffer + SALA_AR_DATA_AT + (slot * RANKS + rank) * (size_t)SLOT_BYTES;
  };
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  for (size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    const uint4 v = xv[i];
#pragma unroll
    for (int p = 0; p < RANKS; ++p)
      if (p != RANK) reinterpret_cast<uint4*>(part(region(p), RANK))[i] = v;
  }
  if (tail && rest < n) {
#pragma unroll
    for (int p = 0; p < RANKS; ++p)
      if (p != RANK) reinterpret_cast<T*>(part(region(p), RANK))[rest] = x[rest];
  }
  // Every thread's pushes, then the flags (one thread a peer): the release orders them first.
  __syncthreads();
  const int p = threadIdx.x;
  if (p < RANKS && p != RANK) {
    __threadfence_system();
    uint32_t* theirs = reinterpret_cast<uint32_t*>(region(p)) + SALA_AR_MAX_BLOCKS + b * SALA_AR_MAX_RANKS + RANK;
    sala_ar_release(theirs, mine);
    const uint32_t* arrived = counts + SALA_AR_MAX_BLOCKS + b * SALA_AR_MAX_RANKS + p;
    const unsigned long long began = sala_ar_now();
    while ((int)(sala_ar_acquire(arrived) - mine) < 0) {
      if (sala_ar_now() - began > (CHECKING ? SALA_AR_CHECK_PATIENCE_NS : SALA_AR_PATIENCE_NS)) {
        if (!CHECKING) __trap();
        atomicExch(reinterpret_cast<uint32_t*>(table[RANK]) + SALA_AR_TIMED_OUT, 1u);
        break;
      }
    }
  }
  __syncthreads();
  for (size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    float sum[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum[j] = 0.f;
#pragma unroll
    for (int r = 0; r < RANKS; ++r) {
      const uint4 v = r == RANK ? xv[i] : __ldcg(reinterpret_cast<const uint4*>(part(own, r)) + i);
      const T* t = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) sum[j] += static_cast<float>(t[j]);
    }
    alignas(16) T out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = static_cast<T>(sum[j]);
    reinterpret_cast<uint4*>(y)[i] = *reinterpret_cast<const uint4*>(out);
  }
  if (tail && rest < n) {
    float sum = 0.f;
#pragma unroll
    for (int r = 0; r < RANKS; ++r) {
      // The peers' values through L2, where their writes land (as __ldcg does for the pieces).
      const T v = r == RANK ? x[rest] : *reinterpret_cast<const volatile T*>(reinterpret_cast<const T*>(part(own, r)) + rest);
      sum += static_cast<float>(v);
    }
    y[rest] = static_cast<T>(sum);
  }
}
