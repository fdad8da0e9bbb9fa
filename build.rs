//! The final binary needs an rpath to the libmlx.so that mlx-sys linked: a dependency's link
//! arguments do not reach it, so mlx-sys publishes the directory as `DEP_MLX_LIB_DIR`.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
