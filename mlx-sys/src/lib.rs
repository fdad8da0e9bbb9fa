//! Raw bindings to mlx-c, generated at build time from the pristine `mlx-sys` 0.7.0 crate.
//! See this crate's `build.rs` for how MLX is located and linked.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

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
