//! Builds mlx-c from the pristine `mlx-sys` 0.7.0 crate without copying it into this repository.
//!
//! 1. Take `mlx-sys-0.7.0.crate` (env `MLX_SYS_CRATE`, else the local cargo cache, else crates.io),
//!    check its sha256 and unpack it into OUT_DIR.
//! 2. Linux/other: compile its mlx-c with `MLX_C_USE_SYSTEM_MLX=ON` against a prebuilt MLX 0.32.2
//!    (env `MLX_DIR`, else a Python that can `import mlx`, else the `mlx-cpu` wheel fetched with pip
//!    into OUT_DIR) and link `libmlx.so` dynamically. `MLX_LINK_DIR` links another libmlx.so with the
//!    same API (the CUDA build) while compiling against the CPU headers.
//!    macOS: the upstream way (MLX fetched and built with Metal, linked statically).
//! 3. Run bindgen over mlx-c's headers.
//!
//! Dependents read `DEP_MLX_LIB_DIR` (the directory of libmlx.so) to set an rpath: link arguments
//! of a dependency do not reach the final binary.

use sha2::{Digest, Sha256};
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

const UPSTREAM: &str = "mlx-sys-0.7.0";
const UPSTREAM_SHA256: &str = "da965f83ce211b80f9b681d9bbd6fa625fe6bb2e659ba7bc55dd95eea8d3b028";
const UPSTREAM_URL: &str = "https://static.crates.io/crates/mlx-sys/mlx-sys-0.7.0.crate";
/// The MLX release mlx-c 0.7.0 is written against (0.32.4 changed `gather_qmm` and the ABI).
const MLX_VERSION: &str = "0.32.2";

type Result<T> = std::result::Result<T, String>;

fn main() {
    for var in [
        "MLX_DIR",
        "MLX_LINK_DIR",
        "MLX_SYS_CRATE",
        "MLX_PYTHON",
        "CARGO_HOME",
        "MLX_RS_METAL_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/compat");

    if let Err(message) = run() {
        panic!("\n\nmlx-sys build failed: {message}\n\n");
    }
}

fn run() -> Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let upstream = unpack_upstream(&out)?;
    let mlx_c = upstream.join("src").join("mlx-c");
    let prelude = if env::var("CARGO_CFG_TARGET_OS").unwrap() == "macos" {
        macos::build(&mlx_c)?;
        None
    } else {
        system_mlx::build(&mlx_c, &out)?
    };
    generate_bindings(&mlx_c, prelude.as_deref(), &out)
}

// ---------------------------------------------------------------------------------------------
// The pristine crate

fn unpack_upstream(out: &Path) -> Result<PathBuf> {
    let dir = out.join(UPSTREAM);
    let done = dir.join(".unpacked");
    if done.exists() {
        return Ok(dir);
    }
    let archive = find_or_fetch_upstream(out)?;
    let bytes = fs::read(&archive).map_err(|e| format!("reading {}: {e}", archive.display()))?;
    let digest = hex(&Sha256::digest(&bytes));
    if digest != UPSTREAM_SHA256 {
        return Err(format!(
            "{} has sha256 {digest}, expected {UPSTREAM_SHA256}; delete it or point MLX_SYS_CRATE at \
             the pristine {UPSTREAM}.crate from crates.io",
            archive.display()
        ));
    }
    let _ = fs::remove_dir_all(&dir);
    tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]))
        .unpack(out)
        .map_err(|e| format!("unpacking {}: {e}", archive.display()))?;
    fs::write(&done, UPSTREAM_SHA256).map_err(|e| e.to_string())?;
    Ok(dir)
}

fn find_or_fetch_upstream(out: &Path) -> Result<PathBuf> {
    let file_name = format!("{UPSTREAM}.crate");
    if let Some(path) = env::var_os("MLX_SYS_CRATE") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("MLX_SYS_CRATE={} is not a file", path.display()))
        };
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(cache) = cargo_home.map(|h| h.join("registry").join("cache")) {
        if let Ok(registries) = fs::read_dir(&cache) {
            for registry in registries.flatten() {
                let candidate = registry.path().join(&file_name);
                if candidate.is_file() {
                    return Ok(candidate);
                }
            }
        }
    }
    let dest = out.join(&file_name);
    if !dest.is_file() {
        let python = python()?;
        let status = Command::new(&python)
            .args([
                "-c",
                "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])",
                UPSTREAM_URL,
            ])
            .arg(&dest)
            .status()
            .map_err(|e| format!("running {python}: {e}"))?;
        if !status.success() {
            let _ = fs::remove_file(&dest);
            return Err(format!(
                "could not download {UPSTREAM_URL}; for an offline build set MLX_SYS_CRATE to a \
                 local copy of {file_name}"
            ));
        }
    }
    Ok(dest)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn python() -> Result<String> {
    if let Ok(python) = env::var("MLX_PYTHON") {
        return Ok(python);
    }
    for candidate in ["python3", "python"] {
        if Command::new(candidate).arg("--version").output().is_ok_and(|o| o.status.success()) {
            return Ok(candidate.to_string());
        }
    }
    Err("no python3 found (needed to locate or fetch MLX); install python3 + pip, set MLX_PYTHON, or \
         set MLX_DIR to an MLX 0.32.2 install"
        .into())
}

// ---------------------------------------------------------------------------------------------
// Bindings

fn generate_bindings(mlx_c: &Path, prelude: Option<&Path>, out: &Path) -> Result<()> {
    let header_dir = mlx_c.join("mlx").join("c");
    let mut headers: Vec<PathBuf> = fs::read_dir(&header_dir)
        .map_err(|e| format!("{}: {e}", header_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    let mut builder = bindgen::Builder::default()
        .rust_target("1.73.0".parse().expect("rust target"))
        .clang_arg(format!("-I{}", mlx_c.display()))
        // bindgen's `c_ulong` sizes trip rustc's suspicious_runtime_symbol_definitions lint.
        .blocklist_function("malloc")
        .blocklist_function("realloc");
    if let Some(prelude) = prelude {
        builder = builder.clang_arg("-include").clang_arg(prelude.display().to_string());
    }
    for header in &headers {
        builder = builder.header(header.display().to_string());
    }
    builder
        .generate()
        .map_err(|e| format!("bindgen: {e} (is libclang-dev installed?)"))?
        .write_to_file(out.join("bindings.rs"))
        .map_err(|e| format!("writing bindings: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Linux and other non-Apple targets: a prebuilt libmlx.so

mod system_mlx {
    use super::*;

    /// Builds mlx-c against a prebuilt MLX and returns the bindgen prelude to use (if any).
    pub fn build(mlx_c: &Path, out: &Path) -> Result<Option<PathBuf>> {
        let prefix = locate_mlx(out)?;
        let cmake_dir = prefix.join("share").join("cmake").join("MLX");
        let link_dir = match env::var_os("MLX_LINK_DIR") {
            Some(dir) => {
                let dir = PathBuf::from(dir);
                if !dir.join("libmlx.so").is_file() {
                    return Err(format!("MLX_LINK_DIR={} holds no libmlx.so", dir.display()));
                }
                dir
            }
            None => prefix.join("lib"),
        };
        let compat = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("src").join("compat");

        let dst = cmake::Config::new(mlx_c)
            .define("MLX_C_USE_SYSTEM_MLX", "ON")
            .define("MLX_C_BUILD_EXAMPLES", "OFF")
            .define("BUILD_SHARED_LIBS", "OFF")
            .define("MLX_DIR", &cmake_dir)
            .define("CMAKE_INSTALL_LIBDIR", "lib")
            .profile("Release")
            .cxxflag(format!("-include {}", compat.join("format_shim.h").display()))
            .build();
        println!("cargo:rustc-link-search=native={}", dst.join("lib").display());
        println!("cargo:rustc-link-lib=static=mlxc");

        let prelude = if env::var("CARGO_CFG_TARGET_ARCH").unwrap() != "aarch64" {
            cc::Build::new()
                .file(compat.join("half_accessors.c"))
                .include(mlx_c)
                .warnings(false)
                .compile("mlx_sys_half_accessors");
            Some(compat.join("half_prelude.h"))
        } else {
            None
        };

        println!("cargo:rustc-link-search=native={}", link_dir.display());
        println!("cargo:rustc-link-lib=dylib=mlx");
        println!("cargo:rustc-link-lib=dylib=stdc++");
        println!("cargo::metadata=lib_dir={}", link_dir.display());
        println!("cargo::metadata=include={}", prefix.join("include").display());
        println!("cargo::metadata=version={MLX_VERSION}");
        Ok(prelude)
    }

    /// The install prefix of MLX (holding `include/`, `lib/libmlx.so`, `share/cmake/MLX`).
    fn locate_mlx(out: &Path) -> Result<PathBuf> {
        if let Some(dir) = env::var_os("MLX_DIR") {
            let mut dir = PathBuf::from(dir);
            // Accept the cmake package directory as well as the prefix.
            if dir.join("MLXConfig.cmake").is_file() {
                dir = dir.join("../../..").canonicalize().map_err(|e| e.to_string())?;
            }
            check_prefix(&dir).map_err(|e| format!("MLX_DIR: {e}"))?;
            return Ok(dir);
        }
        let python = python()?;
        if let Some(dir) = python_mlx(&python) {
            match check_prefix(&dir) {
                Ok(()) => return Ok(dir),
                Err(e) => println!("cargo:warning=ignoring the Python `mlx` package: {e}"),
            }
        }
        fetch_wheel(&python, out)
    }

    fn python_mlx(python: &str) -> Option<PathBuf> {
        let output = Command::new(python)
            .args(["-c", "import mlx; print(list(mlx.__path__)[0])"])
            .output()
            .ok()?;
        output.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
    }

    fn fetch_wheel(python: &str, out: &Path) -> Result<PathBuf> {
        let wheel_root = out.join("mlx-cpu-wheel");
        let prefix = wheel_root.join("mlx");
        if check_prefix(&prefix).is_ok() {
            return Ok(prefix);
        }
        let download = out.join("wheel-download");
        let spec = format!("mlx-cpu=={MLX_VERSION}");
        let status = Command::new(python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d"])
            .arg(&download)
            .arg(&spec)
            .status()
            .map_err(|e| format!("running {python} -m pip: {e}"))?;
        if !status.success() {
            return Err(format!(
                "`pip download {spec}` failed; install it (`pip install {spec}`) or set MLX_DIR to an \
                 MLX {MLX_VERSION} prefix"
            ));
        }
        let wheel = fs::read_dir(&download)
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| format!("pip left no wheel in {}", download.display()))?;
        let status = Command::new(python)
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&wheel_root)
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("could not unpack {}", wheel.display()));
        }
        check_prefix(&prefix)?;
        Ok(prefix)
    }

    fn check_prefix(prefix: &Path) -> Result<()> {
        let cmake_dir = prefix.join("share").join("cmake").join("MLX");
        let config = fs::read_to_string(cmake_dir.join("MLXConfig.cmake"))
            .map_err(|_| format!("{} has no share/cmake/MLX/MLXConfig.cmake", prefix.display()))?;
        if !prefix.join("lib").join("libmlx.so").is_file() {
            return Err(format!("{} has no lib/libmlx.so", prefix.display()));
        }
        let version = fs::read_to_string(cmake_dir.join("MLXConfigVersion.cmake")).unwrap_or_default();
        let wanted = format!("set(PACKAGE_VERSION \"{MLX_VERSION}\")");
        if !version.contains(&wanted) {
            return Err(format!(
                "{} is not MLX {MLX_VERSION} (mlx-c 0.7.0 needs exactly that release)",
                prefix.display()
            ));
        }
        // The CUDA wheel's cmake package demands nvcc; compile against the CPU wheel instead and
        // point MLX_LINK_DIR at the CUDA libmlx.so.
        if config.contains("if(ON)\n    find_dependency(CUDAToolkit") {
            return Err(format!(
                "{} is a CUDA build of MLX; compile against `mlx-cpu=={MLX_VERSION}` and set \
                 MLX_LINK_DIR to the CUDA build's lib directory",
                prefix.display()
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// macOS: the upstream build (MLX fetched by cmake, Metal + Accelerate, static libraries).
// Untested here: kept so the Metal path compiles the way mlx-rs intends.

mod macos {
    use super::*;

    pub fn build(mlx_c: &Path) -> Result<()> {
        let metal = env::var_os("CARGO_FEATURE_METAL").is_some();
        let accelerate = env::var_os("CARGO_FEATURE_ACCELERATE").is_some();
        let mut config = cmake::Config::new(mlx_c);
        config
            .define("CMAKE_C_COMPILER", "/usr/bin/cc")
            .define("CMAKE_CXX_COMPILER", "/usr/bin/c++")
            .define("MLX_C_BUILD_EXAMPLES", "OFF")
            .define("MLX_BUILD_METAL", if metal { "ON" } else { "OFF" })
            .define("MLX_BUILD_ACCELERATE", if accelerate { "ON" } else { "OFF" })
            .profile("Release");
        if metal {
            if env::var_os("CARGO_FEATURE_METAL_JIT").is_some() {
                config.define("MLX_METAL_JIT", "ON");
            }
            let metallib_dir = match env::var_os("MLX_RS_METAL_PATH") {
                Some(path) => PathBuf::from(path),
                None => PathBuf::from(env::var("HOME").map_err(|_| "HOME is not set")?)
                    .join(".mlx")
                    .join("lib")
                    .join(format!("mlx-{MLX_VERSION}")),
            };
            fs::create_dir_all(&metallib_dir).map_err(|e| e.to_string())?;
            config.define("MLX_METAL_PATH", &metallib_dir);
        }
        let dst = config.build();
        for (dir, lib) in static_lib_dirs(&dst, &["mlx", "mlxc", "gguflib", "jaccl"]) {
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=static={lib}");
        }
        println!("cargo:rustc-link-lib=c++");
        println!("cargo:rustc-link-lib=dylib=objc");
        println!("cargo:rustc-link-lib=framework=Foundation");
        if metal {
            println!("cargo:rustc-link-lib=framework=Metal");
        }
        if accelerate {
            println!("cargo:rustc-link-lib=framework=Accelerate");
        }
        println!("cargo::metadata=version={MLX_VERSION}");
        Ok(())
    }

    fn static_lib_dirs(root: &Path, names: &[&str]) -> Vec<(PathBuf, String)> {
        let mut found = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                    for lib in names {
                        if name == format!("lib{lib}.a") && !found.iter().any(|(_, l)| l == lib) {
                            found.push((dir.clone(), lib.to_string()));
                        }
                    }
                }
            }
        }
        found
    }
}
