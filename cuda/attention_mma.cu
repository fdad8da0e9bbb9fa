// The steps the tensor-core attention kernels share (block_sparse_prefill.cu,
// decode_attention_mma.cu): a 64-token tile of keys or values staged from the cache's two buffers,
// a warp's scores against it, the online-softmax update and P·V, flash-attention style. Fragments
// as mma.sync lays them out: lane (r, c) = (lane / 4, lane % 4) holds rows r and r + 8 (query
// heads) and columns 2c, 2c + 1 of each 8-column tile. Staged rows are padded by 8 elements so
// that ldmatrix reads them without bank conflicts. Needs mma.cu.

#define SALA_MMA_TILE 64

// ROWS rows of keys or values from position tok0 on into dst [ROWS][D + 8] asynchronously: from
// the history below `settled`, from the recent buffer above it, zeros past kv_len. THREADS
// threads share the copies (this one is `tid`); the caller commits the group.
template <typename T, int D, int THREADS, int ROWS>
__device__ inline void sala_stage_rows(T* dst, const T* history, const T* recent, int tok0, int kv_len, int settled, int tid) {
  constexpr int KS = D + 8, PIECES = ROWS * D / 8;  // 16-byte pieces
  static_assert(PIECES % THREADS == 0, "whole pieces per thread");
#pragma unroll 1  // the copies do not wait: unrolling would only hold more addresses in registers
  for (int i = 0; i < PIECES / THREADS; ++i) {
    const int e = i * THREADS + tid, j = e / (D / 8), col = (e % (D / 8)) * 8;
    const int tok = tok0 + j;
    const bool ok = tok < kv_len;
    const T* src = !ok ? history : tok < settled ? history + (size_t)tok * D + col : recent + (size_t)(tok - settled) * D + col;
    sala_cp_async16(dst + j * KS + col, src, ok);
  }
}

// Tile b's 64 rows (positions 64b ..) into dst [64][D + 8] (sala_stage_rows), one commit group.
template <typename T, int D, int THREADS>
__device__ inline void sala_stage_tile(T* dst, const T* history, const T* recent, int b, int kv_len, int settled, int tid) {
  sala_stage_rows<T, D, THREADS, SALA_MMA_TILE>(dst, history, recent, b * SALA_MMA_TILE, kv_len, settled, tid);
  asm volatile("cp.async.commit_group;");
}

// Scores of NT 8-token column tiles against the staged keys from row `row0` on: s[nt] = Q · K[row0
// + 8nt ..]ᵀ, float32. Matrices of one ldmatrix: tokens 8nt .. 8nt + 7 at columns 16kk, 16kk + 8,
// 16kk + 16, 16kk + 24 (b0, b1 of two k steps).
template <typename T, int D, int NT>
__device__ inline void sala_score_tiles(float (&s)[NT][4], const uint32_t (&qa)[D / 16][4], const T* ks, int row0, int lane) {
  constexpr int KS = D + 8;
  const int mi = lane >> 3, mj = lane & 7;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
      uint32_t b[4];
      sala_ldmatrix_x4(b, ks + (row0 + 8 * nt + mj) * KS + 16 * kk + 8 * mi);
      sala_mma(s[nt], qa[kk], b[0], b[1], T());
      sala_mma(s[nt], qa[kk + 1], b[2], b[3], T());
    }
  }
}

// The online softmax's running maxima m of rows r and r + 8 moved to cover the masked scores s
// (log2 units, −inf where masked; the row is spread over the 4 lanes of a quad), with the sums l
// and the outputs acc rescaled to them.
template <int NT, int DT>
__device__ inline void sala_softmax_rescale(const float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&acc)[DT][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
  float alpha[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float new_m = fmaxf(m[i], mx[i]);
    alpha[i] = new_m == -INFINITY ? 1.f : exp2f(m[i] - new_m);
    m[i] = new_m;
    l[i] *= alpha[i];
  }
#pragma unroll
  for (int n = 0; n < DT; ++n) {
    acc[n][0] *= alpha[0];
    acc[n][1] *= alpha[0];
    acc[n][2] *= alpha[1];
    acc[n][3] *= alpha[1];
  }
}

// The probabilities of 16 tokens (score tiles s0 and s1, under the maxima m) added to the
// per-lane sums l and, rounded to T as flash attention rounds them, times the staged values of
// rows row0 .. row0 + 15 into acc. The two score tiles are one A fragment; the values are
// transposed on the way (b0, b1: columns 8n and 8n + 8).
template <typename T, int D>
__device__ inline void sala_accumulate_pv(const float (&s0)[4], const float (&s1)[4], const float (&m)[2], float (&l)[2], const T* vs,
                                          int row0, float (&acc)[D / 8][4], int lane) {
  constexpr int KS = D + 8;
  const int mi = lane >> 3, mj = lane & 7;
  float p[2][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float mm = m[e >> 1];
    p[0][e] = mm == -INFINITY ? 0.f : exp2f(s0[e] - mm);
    p[1][e] = mm == -INFINITY ? 0.f : exp2f(s1[e] - mm);
  }
  l[0] += p[0][0] + p[0][1] + p[1][0] + p[1][1];
  l[1] += p[0][2] + p[0][3] + p[1][2] + p[1][3];
  const uint32_t pa[4] = {sala_pack(p[0][0], p[0][1], T()), sala_pack(p[0][2], p[0][3], T()),
                          sala_pack(p[1][0], p[1][1], T()), sala_pack(p[1][2], p[1][3], T())};
#pragma unroll
  for (int n = 0; n < D / 8; n += 2) {
    uint32_t b[4];
    sala_ldmatrix_x4_trans(b, vs + (row0 + 8 * (mi & 1) + mj) * KS + 8 * n + 8 * (mi >> 1));
    sala_mma(acc[n], pa, b[0], b[1], T());
    sala_mma(acc[n + 1], pa, b[2], b[3], T());
  }
}
