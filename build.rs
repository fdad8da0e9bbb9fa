//! Link settings for the final binaries (a dependency's link arguments do not reach them):
//! * an rpath to the libmlx that mlx-sys linked, published as `DEP_MLX_LIB_DIR`;
//! * on Linux with the CPU wheel's MLX, OpenBLAS ahead of it. The wheel's libmlx.so comes with
//!   the reference (netlib) BLAS, which makes every f32 matmul ~50× slower than OpenBLAS; a
//!   library the executable itself needs comes earlier in the dynamic linker's search order than
//!   libmlx.so's own dependencies, so MLX's `cblas_sgemm` calls then land in OpenBLAS.
//!   `SALA_OPENBLAS=/path/libopenblas.so.0` picks the file, `SALA_OPENBLAS=off` skips this.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    println!("cargo:rerun-if-env-changed=SALA_OPENBLAS");
    println!("cargo:rerun-if-env-changed=MLX_LINK_DIR");
    println!("cargo:rerun-if-env-changed=DEP_MLX_MLX_C");
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    // tests/mlx_bindings.rs reads mlx-c's headers from the unpacked crate.
    if let Ok(dir) = std::env::var("DEP_MLX_MLX_C") {
        println!("cargo:rustc-env=SALA_MLX_C_DIR={dir}");
    }
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    // Another libmlx (the CUDA one) goes to machines that may lack OpenBLAS: leave it alone.
    if !linux || std::env::var_os("MLX_LINK_DIR").is_some() {
        return;
    }
    let chosen = std::env::var("SALA_OPENBLAS").ok();
    if chosen.as_deref() == Some("off") {
        return;
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let candidates: Vec<PathBuf> = match chosen {
        Some(path) => vec![PathBuf::from(path)],
        None => [format!("/usr/lib/{arch}-linux-gnu"), "/usr/lib64".into(), "/usr/lib".into(), "/usr/local/lib".into()]
            .iter()
            .map(|dir| PathBuf::from(dir).join("libopenblas.so.0"))
            .collect(),
    };
    match candidates.iter().find(|p| p.is_file()) {
        Some(lib) => println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed,{},--pop-state", lib.display()),
        None => println!(
            "cargo:warning=OpenBLAS not found ({}): MLX's CPU matmuls will use the reference BLAS, ~50× slower; \
             install it (Debian/Ubuntu: apt install libopenblas0) or set SALA_OPENBLAS",
            candidates[0].display()
        ),
    }
}
