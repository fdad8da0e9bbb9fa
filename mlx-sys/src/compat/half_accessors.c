/* float16/bfloat16 accessors for non-aarch64 targets (see half_prelude.h).
 * Both types are 16-bit storage: reading the buffer as uint16 returns the same bits, and
 * MLX's item()/data() do not check the element type. */
#include <stdint.h>
#include "mlx/c/array.h"

int mlx_array_item_float16(uint16_t* res, const mlx_array arr) {
  return mlx_array_item_uint16(res, arr);
}

int mlx_array_item_bfloat16(uint16_t* res, const mlx_array arr) {
  return mlx_array_item_uint16(res, arr);
}

const uint16_t* mlx_array_data_float16(const mlx_array arr) {
  return mlx_array_data_uint16(arr);
}

const uint16_t* mlx_array_data_bfloat16(const mlx_array arr) {
  return mlx_array_data_uint16(arr);
}
