// Where MLX's CUDA backend looks for a custom kernel's compiled module on disk.
//
// MLX 0.32 compiles a custom kernel (mlx::core::fast::cuda_kernel) with NVRTC at its first
// evaluation in every process. Before compiling, it looks for the module in its disk cache
// (MLX_PTX_CACHE_DIR, else <temp>/mlx/<version>/ptx) under "<kernel name>_<hash of the source
// in hex>", the hash being std::hash of the generated source; it only never writes custom
// kernels there. This reads the kernel's name and generated source from the primitive of a
// launched (not yet evaluated) output and names that module, so the caller can put the compiled
// module where MLX will find it. The hash is std::hash of this same C++ library, as MLX's is.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "mlx/array.h"
#include "mlx/fast_primitives.h"
#include "mlx/version.h"
#include "mlx/c/array.h"

extern "C" {

// Receives one of the strings below: `which` 0 the module's name, 1 the kernel's name, 2 its
// generated source, 3 the cache folder ("" when MLX would have none), 4 the path of the MLX
// library (its include folders are beside it).
typedef void (*mlx_sys_put_string)(void* ctx, int which, const char* data, size_t len);

// 0 when `out` is the output of a custom kernel MLX compiles itself (each string given to `put`),
// 1 when it is not (another primitive, or a precompiled kernel), 2 on an error.
int mlx_sys_custom_kernel_module(mlx_array out, mlx_sys_put_string put, void* ctx) {
  try {
    auto& a = *static_cast<mlx::core::array*>(out.ctx);
    if (!a.has_primitive() || std::strcmp(a.primitive().name(), "CustomKernel") != 0) {
      return 1;
    }
    auto state = static_cast<const mlx::core::fast::CustomKernel&>(a.primitive()).state();
    const std::string& name = std::get<0>(state);
    const std::string& source = std::get<1>(state);
    if (std::get<8>(state)) {
      return 1;
    }
    char hash[32];
    std::snprintf(hash, sizeof hash, "%zx", std::hash<std::string>{}(source));
    std::string module = name + "_" + hash;
    // As MLX: the variable, else the temporary folder; MLX keeps no cache where that fails.
    std::filesystem::path folder;
    if (const char* c = std::getenv("MLX_PTX_CACHE_DIR"); c) {
      folder = c;
    } else {
      std::error_code error;
      auto temp = std::filesystem::temp_directory_path(error);
      if (!error) {
        folder = temp / "mlx" / mlx::core::version() / "ptx";
      }
    }
    std::string dir = folder.string();
    put(ctx, 0, module.data(), module.size());
    put(ctx, 1, name.data(), name.size());
    put(ctx, 2, source.data(), source.size());
    put(ctx, 3, dir.data(), dir.size());
    Dl_info library{};
    const char* path = dladdr(reinterpret_cast<void*>(&mlx::core::version), &library) && library.dli_fname ? library.dli_fname : "";
    put(ctx, 4, path, std::strlen(path));
    return 0;
  } catch (...) {
    return 2;
  }
}

}
