// Whether an array is a tracer of a function MLX is compiling (mlx::core::compile): its value is
// the trace's, and it must not outlive the trace. mlx-c does not say.
#include "mlx/array.h"
#include "mlx/c/array.h"

extern "C" {

// 1 when `a` is a tracer, 0 when not (or on an error).
int mlx_sys_array_is_tracer(mlx_array a) {
  try {
    return static_cast<mlx::core::array*>(a.ctx)->is_tracer() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

}
