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
