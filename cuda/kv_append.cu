// One decode token's keys and values appended to a sequence's recent-token buffers
// (engine::cache::SeqBuffer), for a batch of sequences in one launch:
//   out[h, p, :] = recent[h, p, :]                       for p < at
//   out[h, at, :] = row[OFF + h·D .. OFF + (h+1)·D]       the token, from the projection's row
// with OFF the keys' or the values' column in the stacked q/k/v(/gate) projection. Positions after
// `at` are not written: nothing reads a buffer past its fill. The row is read through its column
// stride (it is a view of the projection's output); the buffers are whole, contiguous arrays.
//
// Per sequence and layer this is one launch instead of MLX's slice, reshape, transpose and
// slice-update operations for keys and for values, each costing the host its own work.

template <typename T, int HKV, int D>
__device__ void sala_kv_append_seq(
    const T* row, int64_t col_stride, int off, const T* recent, T* out, int rcap, int at) {
  constexpr int VEC = 16 / sizeof(T);
  static_assert(D % VEC == 0, "whole 16-byte pieces per head");
  constexpr int PER_POS = D / VEC;
  const int n = HKV * (at + 1) * PER_POS;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int c = i % PER_POS;
    const int p = (i / PER_POS) % (at + 1);
    const int h = i / PER_POS / (at + 1);
    const size_t dst = ((size_t)h * rcap + p) * D + (size_t)c * VEC;
    if (p < at) {
      *reinterpret_cast<uint4*>(out + dst) = *reinterpret_cast<const uint4*>(recent + dst);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[dst + e] = row[(int64_t)(off + h * D + c * VEC + e) * col_stride];
    }
  }
}
