/* Included before mlx-c's headers when generating bindings off aarch64.
 * mlx-c only declares its float16/bfloat16 accessors on aarch64 (half.h), but mlx-rs calls them on
 * every target. Declare them everywhere with the same Rust-side types bindgen produces on aarch64:
 * __fp16 (clang accepts it as a storage-only type on every target) and a 16-bit bfloat16. The
 * definitions live in half_accessors.c. */
#include <stdint.h>
#define HAS_FLOAT16
#define HAS_BFLOAT16
typedef __fp16 float16_t;
typedef uint16_t bfloat16_t;
