// The expanded copy of an MLX affine-quantized matrix that a prompt chunk's product multiplies
// (models::layers dequantizes from 256 rows and runs the bf16 GEMM):
//   w[n, c] = scale[n, c / GROUP] · code(n, c) + bias[n, c / GROUP]
// in T, each step rounded to T as MLX's own dequantize computes it, so the copy is the same to
// the bit. MLX's kernel expands one packed byte per thread and stores 2-byte values; here each
// thread writes one 16-byte piece of the copy (VEC values, all in one group since GROUP ≥ 32),
// from the VEC · BITS / 8 bytes of codes beneath it, so that a warp's loads and stores are both
// consecutive. Codes are MLX's packing: code i of a u32 word in its bits [BITS·i, BITS·i + BITS).

template <typename T, int BITS, int GROUP>
__device__ void sala_dequantize(
    const uint32_t* packed,   // [N, K · BITS / 32]
    const T* scales,          // [N, K / GROUP]
    const T* biases,          // [N, K / GROUP]
    size_t pieces,            // N · K / VEC: 16-byte pieces of the copy
    T* out) {                 // [N, K]
  static_assert(BITS == 4 || BITS == 8, "4- or 8-bit codes");
  constexpr int VEC = 16 / sizeof(T);
  constexpr int PER_WORD = 32 / BITS;
  static_assert(GROUP % VEC == 0, "a piece lies in one group");
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= pieces) return;
  // K is a multiple of GROUP, so the flat index of a value over GROUP is its group's flat index.
  const size_t first = i * VEC;
  const T scale = scales[first / GROUP];
  const T bias = biases[first / GROUP];
  // The piece's codes: VEC · BITS bits, whole words (8-bit codes of 8 bf16 values: two) or part
  // of one (4-bit codes of 4 float32 values: half a word).
  constexpr int WORDS = (VEC * BITS + 31) / 32;
  uint32_t words[WORDS];
  const size_t word0 = first / PER_WORD;
  static_assert(WORDS <= 2, "16 bytes of 2-byte or wider values");
  if constexpr (WORDS == 2) {
    const uint2 u = reinterpret_cast<const uint2*>(packed)[word0 / 2];
    words[0] = u.x, words[1] = u.y;
  } else {
    words[0] = packed[word0] >> (BITS * (first % PER_WORD));
  }
  T values[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const uint32_t code = (words[j / PER_WORD] >> (BITS * (j % PER_WORD))) & MASK;
    values[j] = scale * static_cast<T>(static_cast<float>(code)) + bias;
  }
  reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(values);
}
