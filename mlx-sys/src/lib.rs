//! Raw bindings to mlx-c 0.7.0 (`src/bindings.rs`, generated once by bindgen and checked in).
//! See this crate's `build.rs` for how mlx-c is compiled and MLX located and linked.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!("bindings.rs");

/// mlx-rs seeds its default random state with macOS's `mach_approximate_time` (through the
/// `mach-sys` crate, which only declares it). Off Apple platforms nothing defines that symbol, so
/// provide it here: any monotonically increasing nanosecond count is an equally good seed.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Receives one string of [`mlx_sys_custom_kernel_module`]'s: `which` 0 the module's name, 1 the
/// kernel's name, 2 its generated source, 3 MLX's cache folder ("" when MLX has none), 4 the
/// MLX library's path.
pub type mlx_sys_put_string = Option<unsafe extern "C" fn(ctx: *mut std::ffi::c_void, which: i32, data: *const std::ffi::c_char, len: usize)>;

extern "C" {
    /// Ours (`src/custom_kernel_module.cpp`): for the output of a custom kernel MLX compiles
    /// itself, the name, source and folder of the module MLX's CUDA backend looks for on disk
    /// before compiling it. 0 given, 1 not such an output, 2 an error.
    pub fn mlx_sys_custom_kernel_module(out: mlx_array, put: mlx_sys_put_string, ctx: *mut std::ffi::c_void) -> i32;
    /// Ours (`src/array_tracer.cpp`): 1 when the array is a tracer of a function MLX is
    /// compiling, else 0.
    pub fn mlx_sys_array_is_tracer(a: mlx_array) -> i32;
}
