//! Builds mlx-c from the pristine `mlx-sys` 0.7.0 crate without copying it into this repository,
//! with nothing but a C/C++ compiler and python3 (no cmake, no libclang, no pip).
//!
//! 1. Take `mlx-sys-0.7.0.crate` (env `MLX_SYS_CRATE`, else the local cargo cache, else crates.io),
//!    check its sha256 and unpack it into OUT_DIR.
//! 2. Find a prebuilt MLX 0.32.2 (env `MLX_DIR`, else a Python that can `import mlx`, else the
//!    pinned PyPI wheel for this platform, downloaded with python3's urllib and checked against its
//!    sha256): `mlx-cpu` on Linux, `mlx-metal` on macOS (its `mlx.metallib` holds the Metal kernels
//!    already compiled, so no Xcode Metal compiler is needed). `MLX_LINK_DIR` links another
//!    libmlx.so with the same API (the CUDA build) while compiling against the CPU headers.
//! 3. Compile mlx-c's sources (the list in its CMakeLists.txt) with the `cc` crate and link
//!    libmlx dynamically.
//! 4. The Rust declarations are `src/bindings.rs`, generated once by bindgen and checked in
//!    (tests/mlx_bindings.rs at the repository root checks them against the headers). Regenerate
//!    with `cargo build --features mlx-sys/regenerate-bindings` (needs libclang).
//!
//! Dependents read `DEP_MLX_LIB_DIR` (the directory of libmlx) to set an rpath, since link
//! arguments of a dependency do not reach the final binary, and `DEP_MLX_MLX_C` (mlx-c's source).

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
/// sha256 of mlx-c's headers (`mlx/c/*.h`, sorted by name, concatenated) that `src/bindings.rs`
/// was generated from.
const HEADERS_SHA256: &str = "71cf82742cb80c776c7f09d9b03f32a72bd5f7f1104fe93ca28e9f3d008d0421";

/// A pinned PyPI wheel of MLX 0.32.2.
struct Wheel {
    os: &'static str,
    arch: &'static str,
    /// The oldest macOS release the wheel is built for (0 off macOS).
    min_macos: u32,
    url: &'static str,
    sha256: &'static str,
}

const PYPI: &str = "https://files.pythonhosted.org/packages";
const WHEELS: &[Wheel] = &[
    Wheel {
        os: "linux",
        arch: "x86_64",
        min_macos: 0,
        url: "3c/8b/2305637be752d0827594de266eaee3d282f780ba7877c0e15881cdf9da5e/mlx_cpu-0.32.2-py3-none-manylinux_2_35_x86_64.whl",
        sha256: "fc5d31b90fc4f457b2f9614ed45651a567d22a6a11a03d114a90a4e10bdd8878",
    },
    Wheel {
        os: "linux",
        arch: "aarch64",
        min_macos: 0,
        url: "56/fa/4a37da905a3ea27bd5c041a26d8a5a58a35fb540b4c4de5a69c5e0173e29/mlx_cpu-0.32.2-py3-none-manylinux_2_35_aarch64.whl",
        sha256: "d0f94625588b51a878786dd51cec5617894ce586cf3c94645ce1b64e24c27c0b",
    },
    Wheel {
        os: "macos",
        arch: "aarch64",
        min_macos: 26,
        url: "dd/cd/4e50bf325100e7165e13d025f264362bf0009196269f9eaf87f2c6e738a2/mlx_metal-0.32.2-py3-none-macosx_26_0_arm64.whl",
        sha256: "e6abeac9ac5265830c9c1541b6f96e9be37a85c2446763a46ad466c63a3837ab",
    },
    Wheel {
        os: "macos",
        arch: "aarch64",
        min_macos: 15,
        url: "79/ec/34f37376e26d537fadffb99af3a760d6545e37f5e1a30a552baadf237fc5/mlx_metal-0.32.2-py3-none-macosx_15_0_arm64.whl",
        sha256: "55a369250d220b2cf10213a87a2ac1b1a420608c5b35b1df4e7147ac8e32f121",
    },
    Wheel {
        os: "macos",
        arch: "aarch64",
        min_macos: 14,
        url: "f7/ab/ba1952908c5d2a5070cf1cfbfea0161c4751ea62299e2776819810917483/mlx_metal-0.32.2-py3-none-macosx_14_0_arm64.whl",
        sha256: "3825fff379dbc107dd3413e564a06caeaa24819910ec49c0439e454c06a1b9b8",
    },
];

type Result<T> = std::result::Result<T, String>;

fn main() {
    for var in ["MLX_DIR", "MLX_LINK_DIR", "MLX_SYS_CRATE", "MLX_PYTHON", "CARGO_HOME"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/compat");
    println!("cargo:rerun-if-changed=src/custom_kernel_module.cpp");
    println!("cargo:rerun-if-changed=src/array_tracer.cpp");

    if let Err(message) = run() {
        panic!("\n\nmlx-sys build failed: {message}\n\n");
    }
}

fn run() -> Result<()> {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target = Target::current();
    let upstream = unpack_upstream(&out)?;
    let mlx_c = upstream.join("src").join("mlx-c");
    check_headers(&mlx_c)?;
    let prefix = locate_mlx(&target, &out)?;
    let link_dir = link_dir(&target, &prefix)?;
    compile_mlx_c(&target, &mlx_c, &prefix)?;

    println!("cargo:rustc-link-search=native={}", link_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib={}", if target.os == "macos" { "c++" } else { "stdc++" });
    println!("cargo::metadata=lib_dir={}", link_dir.display());
    println!("cargo::metadata=include={}", prefix.join("include").display());
    println!("cargo::metadata=mlx_c={}", mlx_c.display());
    println!("cargo::metadata=version={MLX_VERSION}");

    #[cfg(feature = "regenerate-bindings")]
    regenerate::bindings(&mlx_c)?;
    Ok(())
}

struct Target {
    os: String,
    arch: String,
}

impl Target {
    fn current() -> Self {
        Target { os: env::var("CARGO_CFG_TARGET_OS").unwrap(), arch: env::var("CARGO_CFG_TARGET_ARCH").unwrap() }
    }

    fn library(&self) -> &'static str {
        if self.os == "macos" {
            "libmlx.dylib"
        } else {
            "libmlx.so"
        }
    }
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
        download(UPSTREAM_URL, &dest).map_err(|e| {
            format!("{e}; for an offline build set MLX_SYS_CRATE to a local copy of {file_name}")
        })?;
    }
    Ok(dest)
}

/// Downloads with python3's urllib (no HTTP client among the build dependencies), through a
/// temporary name so an interrupted download never looks complete.
fn download(url: &str, dest: &Path) -> Result<()> {
    let python = python()?;
    let partial = dest.with_extension("partial");
    let status = Command::new(&python)
        .args(["-c", "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])", url])
        .arg(&partial)
        .status()
        .map_err(|e| format!("running {python}: {e}"))?;
    if !status.success() {
        let _ = fs::remove_file(&partial);
        return Err(format!("could not download {url}"));
    }
    fs::rename(&partial, dest).map_err(|e| e.to_string())
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
    Err("no python3 found (needed to locate or fetch MLX); install python3, set MLX_PYTHON, or set \
         MLX_DIR to an MLX 0.32.2 install"
        .into())
}

/// mlx-c's headers, `mlx/c/*.h`, sorted by name.
fn headers(mlx_c: &Path) -> Result<Vec<PathBuf>> {
    let dir = mlx_c.join("mlx").join("c");
    let mut headers: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    Ok(headers)
}

/// The checked-in bindings hold only for the headers they were generated from.
fn check_headers(mlx_c: &Path) -> Result<()> {
    let mut hasher = Sha256::new();
    for header in &headers(mlx_c)? {
        hasher.update(fs::read(header).map_err(|e| format!("{}: {e}", header.display()))?);
    }
    let digest = hex(&hasher.finalize());
    if digest != HEADERS_SHA256 && !cfg!(feature = "regenerate-bindings") {
        return Err(format!(
            "mlx-c's headers in {} (sha256 {digest}) are not the ones src/bindings.rs was generated \
             from ({HEADERS_SHA256}); regenerate with `--features mlx-sys/regenerate-bindings`",
            mlx_c.join("mlx").join("c").display()
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// MLX: a prebuilt library

/// The install prefix of MLX (holding `include/`, `lib/libmlx.{so,dylib}`, `share/cmake/MLX`).
fn locate_mlx(target: &Target, out: &Path) -> Result<PathBuf> {
    if let Some(dir) = env::var_os("MLX_DIR") {
        let mut dir = PathBuf::from(dir);
        // Accept the cmake package directory as well as the prefix.
        if dir.join("MLXConfig.cmake").is_file() {
            dir = dir.join("../../..").canonicalize().map_err(|e| e.to_string())?;
        }
        check_prefix(target, &dir).map_err(|e| format!("MLX_DIR: {e}"))?;
        return Ok(dir);
    }
    let python = python()?;
    if let Some(dir) = python_mlx(&python) {
        match check_prefix(target, &dir) {
            Ok(()) => return Ok(dir),
            Err(e) => println!("cargo:warning=ignoring the Python `mlx` package: {e}"),
        }
    }
    fetch_wheel(target, out)
}

fn python_mlx(python: &str) -> Option<PathBuf> {
    let output = Command::new(python)
        .args(["-c", "import mlx; print(list(mlx.__path__)[0])"])
        .output()
        .ok()?;
    output.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
}

fn macos_major() -> Result<u32> {
    let output = Command::new("sw_vers")
        .arg("-productVersion")
        .output()
        .map_err(|e| format!("running sw_vers: {e}"))?;
    let version = String::from_utf8_lossy(&output.stdout);
    version
        .trim()
        .split('.')
        .next()
        .and_then(|major| major.parse().ok())
        .ok_or_else(|| format!("sw_vers printed {:?}, not a macOS version", version.trim()))
}

fn pick_wheel(target: &Target) -> Result<&'static Wheel> {
    let macos = if target.os == "macos" { macos_major()? } else { 0 };
    WHEELS
        .iter()
        .find(|w| w.os == target.os && w.arch == target.arch && w.min_macos <= macos)
        .ok_or_else(|| {
            let what = if target.os == "macos" {
                format!("macOS {macos} on {}: MLX's Metal wheels need Apple silicon and macOS 14 or later", target.arch)
            } else {
                format!("{} on {}", target.os, target.arch)
            };
            format!("no prebuilt MLX {MLX_VERSION} wheel for {what}; set MLX_DIR to an MLX {MLX_VERSION} install")
        })
}

fn fetch_wheel(target: &Target, out: &Path) -> Result<PathBuf> {
    let wheel = pick_wheel(target)?;
    let file_name = wheel.url.rsplit('/').next().unwrap();
    let root = out.join("mlx-wheel");
    let prefix = root.join("mlx");
    let done = root.join(".unpacked");
    if fs::read_to_string(&done).is_ok_and(|s| s == wheel.sha256) && check_prefix(target, &prefix).is_ok() {
        return Ok(prefix);
    }
    let archive = out.join(file_name);
    if !archive.is_file() {
        download(&format!("{PYPI}/{}", wheel.url), &archive).map_err(|e| {
            format!("{e}; download it yourself and `pip install` it, or set MLX_DIR to an MLX {MLX_VERSION} install")
        })?;
    }
    let digest = hex(&Sha256::digest(fs::read(&archive).map_err(|e| e.to_string())?));
    if digest != wheel.sha256 {
        let _ = fs::remove_file(&archive);
        return Err(format!("{file_name} has sha256 {digest}, expected {}; deleted it, build again", wheel.sha256));
    }
    let _ = fs::remove_dir_all(&root);
    let status = Command::new(python()?)
        .args(["-m", "zipfile", "-e"])
        .arg(&archive)
        .arg(&root)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("could not unpack {}", archive.display()));
    }
    check_prefix(target, &prefix)?;
    fs::write(&done, wheel.sha256).map_err(|e| e.to_string())?;
    Ok(prefix)
}

fn check_prefix(target: &Target, prefix: &Path) -> Result<()> {
    let cmake_dir = prefix.join("share").join("cmake").join("MLX");
    let config = fs::read_to_string(cmake_dir.join("MLXConfig.cmake"))
        .map_err(|_| format!("{} has no share/cmake/MLX/MLXConfig.cmake", prefix.display()))?;
    if !prefix.join("lib").join(target.library()).is_file() {
        return Err(format!("{} has no lib/{}", prefix.display(), target.library()));
    }
    if !prefix.join("include").join("mlx").join("mlx.h").is_file() {
        return Err(format!("{} has no include/mlx/mlx.h", prefix.display()));
    }
    let version = fs::read_to_string(cmake_dir.join("MLXConfigVersion.cmake")).unwrap_or_default();
    let wanted = format!("set(PACKAGE_VERSION \"{MLX_VERSION}\")");
    if !version.contains(&wanted) {
        return Err(format!("{} is not MLX {MLX_VERSION} (mlx-c 0.7.0 needs exactly that release)", prefix.display()));
    }
    // The CUDA wheel's headers expect nvcc's; compile against the CPU wheel instead and point
    // MLX_LINK_DIR at the CUDA libmlx.so.
    if config.contains("if(ON)\n    find_dependency(CUDAToolkit") {
        return Err(format!(
            "{} is a CUDA build of MLX; compile against `mlx-cpu=={MLX_VERSION}` and set MLX_LINK_DIR \
             to the CUDA build's lib directory",
            prefix.display()
        ));
    }
    Ok(())
}

fn link_dir(target: &Target, prefix: &Path) -> Result<PathBuf> {
    match env::var_os("MLX_LINK_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if !dir.join(target.library()).is_file() {
                return Err(format!("MLX_LINK_DIR={} holds no {}", dir.display(), target.library()));
            }
            Ok(dir)
        }
        None => Ok(prefix.join("lib")),
    }
}

// ---------------------------------------------------------------------------------------------
// mlx-c

/// mlx-c's sources: the `mlx/c/*.cpp` its CMakeLists.txt compiles (a commented-out line stays out).
fn mlx_c_sources(mlx_c: &Path) -> Result<Vec<PathBuf>> {
    let cmake = fs::read_to_string(mlx_c.join("CMakeLists.txt")).map_err(|e| format!("mlx-c CMakeLists.txt: {e}"))?;
    let sources: Vec<PathBuf> = cmake
        .lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("${CMAKE_CURRENT_LIST_DIR}/"))
        .map(|file| file.trim_end_matches(')'))
        .filter(|file| file.starts_with("mlx/c/") && file.ends_with(".cpp"))
        .map(|file| mlx_c.join(file))
        .collect();
    if sources.len() < 20 {
        return Err(format!("found only {} sources in mlx-c's CMakeLists.txt", sources.len()));
    }
    Ok(sources)
}

fn compile_mlx_c(target: &Target, mlx_c: &Path, prefix: &Path) -> Result<()> {
    let compat = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("src").join("compat");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .files(mlx_c_sources(mlx_c)?)
        // Ours: names the disk-cache entry MLX's CUDA backend looks for before compiling a
        // custom kernel (see the file).
        .file(compat.parent().expect("src").join("custom_kernel_module.cpp"))
        // Ours: whether an array is a tracer of a compiled function (see the file).
        .file(compat.parent().expect("src").join("array_tracer.cpp"))
        .include(mlx_c)
        .flag("-isystem")
        .flag(prefix.join("include").display().to_string())
        .flag("-std=gnu++20")
        // Thin wrappers called on every operation: optimised even in debug builds.
        .opt_level(3)
        .debug(false)
        .define("NDEBUG", None)
        .pic(true)
        .warnings(false);
    if target.os == "macos" {
        // The compile definitions MLX's Metal build exports to its users (MLXConfig.cmake).
        build.define("ACCELERATE_NEW_LAPACK", None).define("_METAL_", None);
    } else {
        build.flag("-include").flag(compat.join("format_shim.h").display().to_string());
    }
    build.try_compile("mlxc").map_err(|e| format!("compiling mlx-c: {e}"))?;

    // mlx-c declares its float16/bfloat16 accessors only on aarch64; define them elsewhere.
    if target.arch != "aarch64" {
        cc::Build::new()
            .file(compat.join("half_accessors.c"))
            .include(mlx_c)
            .opt_level(3)
            .warnings(false)
            .try_compile("mlx_sys_half_accessors")
            .map_err(|e| format!("compiling half_accessors.c: {e}"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Regenerating src/bindings.rs (maintainers only)

#[cfg(feature = "regenerate-bindings")]
mod regenerate {
    use super::*;

    /// Writes `src/bindings.rs` from mlx-c's headers: only mlx-c's own items, for a 64-bit target
    /// with the aarch64 half types (`half_prelude.h`), so one file serves every platform.
    pub fn bindings(mlx_c: &Path) -> Result<()> {
        let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
        let mut builder = bindgen::Builder::default()
            .rust_target("1.73.0".parse().expect("rust target"))
            .clang_arg("--target=x86_64-unknown-linux-gnu")
            .clang_arg(format!("-I{}", mlx_c.display()))
            .clang_arg("-include")
            .clang_arg(manifest.join("src/compat/half_prelude.h").display().to_string())
            .allowlist_function("_?mlx_.*")
            .allowlist_type("_?mlx_.*|float16_t|bfloat16_t")
            .allowlist_var("_?mlx_.*")
            // Only the graph printers take a FILE*; keep the file free of the C library's layout.
            .blocklist_type("FILE|_IO_.*|__off(64)?_t")
            .raw_line("pub type FILE = core::ffi::c_void;")
            .layout_tests(false);
        for header in headers(mlx_c)? {
            builder = builder.header(header.display().to_string());
        }
        let text = builder.generate().map_err(|e| format!("bindgen: {e} (is libclang installed?)"))?.to_string();
        let banner = format!(
            "// Generated by mlx-sys/build.rs with `--features mlx-sys/regenerate-bindings` (bindgen) from\n\
             // the headers of mlx-c 0.7.0 in {UPSTREAM}.crate, sha256 of the sorted headers {HEADERS_SHA256}.\n\
             // Do not edit; tests/mlx_bindings.rs checks it against the headers.\n\n"
        );
        fs::write(manifest.join("src").join("bindings.rs"), banner + &text).map_err(|e| format!("writing bindings: {e}"))
    }
}
