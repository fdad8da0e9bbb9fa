//! Our CUDA kernels compiled once per machine instead of once per process. MLX compiles a custom
//! kernel with NVRTC at the first evaluation of each variant (seconds each on a GPU host: a new
//! batch size or split count stalled every stream of a server), and before compiling looks for
//! the module in its disk cache, where it never writes custom kernels. At a variant's first
//! launch in a process, [`prepare`] compiles the source MLX generated, through the NVRTC MLX
//! loaded, for the same GPU, and puts the module under the name MLX looks for
//! (`mlx-sys/src/custom_kernel_module.cpp` names it): later processes load it in milliseconds.
//! Anything missing (no NVRTC, a compile error, a folder not writable) leaves MLX to compile the
//! kernel as before (a warning, the first time).

use crate::engine::checkpoint;
use mlx_rs::Array;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A custom kernel's module as MLX names and compiles it.
pub struct Module {
    /// The file name MLX looks for (the kernel's name and the hash of its source).
    pub name: String,
    /// The kernel's name without its namespace.
    pub kernel: String,
    /// The whole source MLX generated (its signature, template constants and our body).
    pub source: String,
    /// MLX's cache folder.
    pub folder: PathBuf,
    /// The MLX library's path: the headers MLX compiles against are beside it.
    pub library: PathBuf,
}

impl Module {
    /// The module of `output`'s kernel, where `output` is an unevaluated output of a custom
    /// kernel MLX compiles itself and MLX keeps a cache folder.
    pub fn of(output: &Array) -> Option<Module> {
        unsafe extern "C" fn put(ctx: *mut std::ffi::c_void, which: i32, data: *const std::ffi::c_char, len: usize) {
            // SAFETY: `ctx` is the array of strings below and `data` holds `len` bytes.
            let parts = unsafe { &mut *(ctx as *mut [String; 5]) };
            let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, len) };
            if let Some(part) = parts.get_mut(which as usize) {
                *part = String::from_utf8_lossy(bytes).into_owned();
            }
        }
        let mut parts: [String; 5] = Default::default();
        // SAFETY: the array outlives the call; `put` only writes into `parts`.
        let status = unsafe { mlx_sys::mlx_sys_custom_kernel_module(output.as_ptr(), Some(put), &mut parts as *mut _ as *mut std::ffi::c_void) };
        let [name, kernel, source, folder, library] = parts;
        (status == 0 && !folder.is_empty()).then(|| Module { name, kernel, source, folder: folder.into(), library: library.into() })
    }

    /// The compiled image's path, as MLX forms it: a name longer than 245 characters is cut into
    /// folders of 245 (the last piece the file's name).
    pub fn image_path(&self) -> PathBuf {
        const LONGEST: usize = 245;
        let mut path = self.folder.clone();
        let mut rest = self.name.as_str();
        while rest.len() > LONGEST {
            let cut = (0..=LONGEST).rev().find(|&i| rest.is_char_boundary(i)).unwrap_or(0);
            path.push(&rest[..cut]);
            rest = &rest[cut..];
        }
        path.push(format!("{rest}.ptx"));
        path
    }

    /// The name MLX looks the kernel up by, and lists beside the image.
    fn entry(&self) -> String {
        format!("mlx::core::cu::{}", self.kernel)
    }
}

static FOUND: AtomicUsize = AtomicUsize::new(0);
static COMPILED: AtomicUsize = AtomicUsize::new(0);
static LEFT: AtomicUsize = AtomicUsize::new(0);

/// How many variants this process found in the cache, has compiled into it so far, and left to
/// MLX (see the warning).
pub fn counts() -> (usize, usize, usize) {
    (FOUND.load(Ordering::Relaxed), COMPILED.load(Ordering::Relaxed), LEFT.load(Ordering::Relaxed))
}

/// Puts the module of `output`'s kernel into MLX's cache unless it is there: compiled on a pool of
/// background threads, so that the many variants one step meets at once (a new batch size)
/// compile side by side. Evaluations wait for the pool first ([`settle`], through
/// `engine::device::await_kernel_compiles`): MLX, which would compile each kernel it meets in
/// turn, then loads them all.
pub fn prepare(output: &Array) {
    let Some(module) = Module::of(output) else {
        return left_to_mlx("MLX names no cache folder for this kernel".into());
    };
    if module.image_path().is_file() {
        FOUND.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let pool = &*POOL;
    {
        let mut jobs = pool.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.push_back(module);
        pool.pending.fetch_add(1, Ordering::AcqRel);
    }
    pool.changed.notify_all();
    pool.start_workers();
}

/// Waits until the pool has compiled every module given to it so far.
pub fn settle() {
    settle_reporting(|_, _| {});
}

/// [`settle`], calling `progress(done, total)` as modules are done: `total` is what was queued or
/// compiling when it began, and grows if more come meanwhile.
pub fn settle_reporting(mut progress: impl FnMut(usize, usize)) {
    let pool = &*POOL;
    let mut total = 0;
    let mut report = |left: usize| {
        total = total.max(left);
        progress(total - left, total);
    };
    // Asked before every evaluation: nothing to wait for is the common case, answered unlocked.
    if pool.pending.load(Ordering::Acquire) == 0 {
        return report(0);
    }
    let mut jobs = pool.jobs.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // Changed only under the lock held here.
        let left = pool.pending.load(Ordering::Acquire);
        report(left);
        if left == 0 {
            return;
        }
        jobs = pool.changed.wait(jobs).unwrap_or_else(|e| e.into_inner());
    }
}

fn left_to_mlx(why: String) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| eprintln!("warning: a GPU kernel is left to MLX to compile in this process, not kept on disk: {why}"));
    LEFT.fetch_add(1, Ordering::Relaxed);
}

/// The compiling threads and their queue.
struct Pool {
    jobs: std::sync::Mutex<std::collections::VecDeque<Module>>,
    changed: std::sync::Condvar,
    /// Modules queued or being compiled; changed under the lock of `jobs`.
    pending: AtomicUsize,
    started: std::sync::Once,
}

static POOL: std::sync::LazyLock<Pool> = std::sync::LazyLock::new(|| Pool {
    jobs: Default::default(),
    changed: std::sync::Condvar::new(),
    pending: AtomicUsize::new(0),
    started: std::sync::Once::new(),
});

impl Pool {
    /// One thread per core but one (NVRTC compiles on one core), at most 16.
    fn start_workers(&'static self) {
        self.started.call_once(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            for i in 0..(cores - 1).clamp(1, 16) {
                let spawned = std::thread::Builder::new().name(format!("kernel-compile-{i}")).spawn(move || self.work());
                if let Err(e) = spawned {
                    eprintln!("warning: no thread to compile kernels on: {e}");
                }
            }
        });
    }

    fn work(&self) {
        loop {
            let module = {
                let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(module) = jobs.pop_front() {
                        break module;
                    }
                    jobs = self.changed.wait(jobs).unwrap_or_else(|e| e.into_inner());
                }
            };
            match store_compiled(&module, |m| nvrtc()?.compile(m)) {
                Ok(true) => _ = COMPILED.fetch_add(1, Ordering::Relaxed),
                Ok(false) => _ = FOUND.fetch_add(1, Ordering::Relaxed),
                Err(why) => left_to_mlx(why),
            }
            // Under the lock, so that a waiter in `settle` cannot miss the change.
            let _jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.changed.notify_all();
        }
    }
}

/// Stores `compile(module)` (the image and the kernel's lowered name) unless the image is there
/// already; true when it compiled. The list of names goes first and the image last, each
/// written aside and renamed into place (`engine::checkpoint`'s partial files): MLX takes an
/// image without its list for a module with no kernels, and another process may be reading
/// either.
pub fn store_compiled(module: &Module, compile: impl FnOnce(&Module) -> Result<(Vec<u8>, String), String>) -> Result<bool, String> {
    let image = module.image_path();
    if image.is_file() {
        return Ok(false);
    }
    let (bytes, lowered) = compile(module)?;
    let names = image.with_extension("txt");
    let folder = image.parent().unwrap_or(&module.folder);
    std::fs::create_dir_all(folder).map_err(|e| format!("cannot make {}: {e}", folder.display()))?;
    checkpoint::write_whole(&names, format!("{}\t{lowered}\n", module.entry()).as_bytes())
        .and_then(|()| checkpoint::write_whole(&image, &bytes))
        .map_err(|e| format!("cannot write {}: {e}", image.display()))?;
    Ok(true)
}

/// What the generated source includes (`mlx/backend/cuda/device/utils.cuh`, which MLX keeps
/// inside its library): the CUDA headers it brings in and the shape types of the kernel
/// signature. Our kernels use nothing else of it.
const DEVICE_HEADER: &str = "#pragma once
#include \"mlx/backend/cuda/device/config.h\"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/complex>
#include <cuda/std/limits>
#include <cuda/std/tuple>
#include <cuda/std/type_traits>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}
";

/// The NVRTC library MLX loaded, through its C API.
struct Nvrtc {
    library: libloading::Library,
}

type Program = *mut std::ffi::c_void;

fn nvrtc() -> Result<&'static Nvrtc, String> {
    static NVRTC: std::sync::OnceLock<Result<Nvrtc, String>> = std::sync::OnceLock::new();
    NVRTC
        .get_or_init(|| {
            // MLX has it loaded: the name finds that copy.
            ["libnvrtc.so.13", "libnvrtc.so.12"]
                .iter()
                // SAFETY: loading NVRTC runs no initialisers of consequence.
                .find_map(|name| unsafe { libloading::Library::new(name) }.ok())
                .map(|library| Nvrtc { library })
                .ok_or_else(|| "NVRTC (libnvrtc.so.13 or .12) is not loaded".to_string())
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Nvrtc {
    /// Compiles `module` as MLX does (the same options, SASS for this GPU): its image and the
    /// kernel's lowered name.
    fn compile(&self, module: &Module) -> Result<(Vec<u8>, String), String> {
        use std::ffi::{c_char, c_int, CStr, CString};
        let (major, minor) = crate::engine::device::cuda_compute_capability().ok_or("no CUDA device")?;
        let mut options = vec![
            "--device-as-default-execution-space".to_string(),
            format!("--gpu-architecture=sm_{major}{minor}{}", if major >= 9 { "a" } else { "" }),
        ];
        options.extend(include_folders(&module.library)?.iter().map(|f| format!("--include-path={}", f.display())));
        let cstr = |s: &str| CString::new(s).map_err(|_| "a NUL byte in the kernel's source".to_string());
        let (source, file) = (cstr(&module.source)?, cstr(&format!("{}.cu", module.name))?);
        let (header, header_name) = (cstr(DEVICE_HEADER)?, cstr("mlx/backend/cuda/device/utils.cuh")?);
        let entry = cstr(&module.entry())?;
        let options: Vec<CString> = options.iter().map(|o| cstr(o)).collect::<Result<_, _>>()?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: NVRTC's C API as documented; every pointer outlives the program, which is
        // destroyed on every path.
        unsafe {
            let sym = |name: &[u8]| self.library.get::<*const ()>(name).map(|s| *s).map_err(|e| format!("NVRTC: {e}"));
            let create: unsafe extern "C" fn(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> c_int =
                std::mem::transmute(sym(b"nvrtcCreateProgram\0")?);
            let add_name: unsafe extern "C" fn(Program, *const c_char) -> c_int = std::mem::transmute(sym(b"nvrtcAddNameExpression\0")?);
            let compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int = std::mem::transmute(sym(b"nvrtcCompileProgram\0")?);
            let log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int = std::mem::transmute(sym(b"nvrtcGetProgramLogSize\0")?);
            let log: unsafe extern "C" fn(Program, *mut c_char) -> c_int = std::mem::transmute(sym(b"nvrtcGetProgramLog\0")?);
            let lowered_name: unsafe extern "C" fn(Program, *const c_char, *mut *const c_char) -> c_int =
                std::mem::transmute(sym(b"nvrtcGetLoweredName\0")?);
            let image_size: unsafe extern "C" fn(Program, *mut usize) -> c_int = std::mem::transmute(sym(b"nvrtcGetCUBINSize\0")?);
            let image: unsafe extern "C" fn(Program, *mut c_char) -> c_int = std::mem::transmute(sym(b"nvrtcGetCUBIN\0")?);
            let destroy: unsafe extern "C" fn(*mut Program) -> c_int = std::mem::transmute(sym(b"nvrtcDestroyProgram\0")?);

            let mut program: Program = std::ptr::null_mut();
            if create(&mut program, source.as_ptr(), file.as_ptr(), 1, &header.as_ptr(), &header_name.as_ptr()) != 0 {
                return Err("nvrtcCreateProgram failed".into());
            }
            let result = (|| {
                if add_name(program, entry.as_ptr()) != 0 {
                    return Err("nvrtcAddNameExpression failed".to_string());
                }
                if compile(program, option_ptrs.len() as c_int, option_ptrs.as_ptr()) != 0 {
                    let mut size = 0;
                    log_size(program, &mut size);
                    let mut text = vec![0u8; size.max(1)];
                    log(program, text.as_mut_ptr() as *mut c_char);
                    let text = String::from_utf8_lossy(&text);
                    return Err(format!("NVRTC could not compile {}: {}", module.kernel, text.trim_end_matches('\0').trim()));
                }
                let mut lowered: *const c_char = std::ptr::null();
                if lowered_name(program, entry.as_ptr(), &mut lowered) != 0 || lowered.is_null() {
                    return Err("nvrtcGetLoweredName failed".to_string());
                }
                let lowered = CStr::from_ptr(lowered).to_string_lossy().into_owned();
                let mut size = 0;
                if image_size(program, &mut size) != 0 {
                    return Err("nvrtcGetCUBINSize failed".to_string());
                }
                let mut bytes = vec![0u8; size];
                if image(program, bytes.as_mut_ptr() as *mut c_char) != 0 {
                    return Err("nvrtcGetCUBIN failed".to_string());
                }
                Ok((bytes, lowered))
            })();
            destroy(&mut program);
            result
        }
    }
}

/// The include folders MLX compiles against, found as MLX finds them from its library's path:
/// its headers and CCCL's beside the library, then the CUDA headers of the Python package
/// beside those (`nvidia/cu13` or `nvidia/cuda_runtime`), else of CUDA_HOME, CUDA_PATH or
/// /usr/local/cuda.
fn include_folders(library: &Path) -> Result<Vec<PathBuf>, String> {
    let root = library.parent().and_then(Path::parent).ok_or("MLX's library path is unknown")?;
    let mut folders: Vec<PathBuf> = [root.join("include"), root.join("include").join("cccl")].into_iter().filter(|f| f.is_dir()).collect();
    let packaged = ["cu13", "cuda_runtime"].iter().map(|d| root.parent().unwrap_or(root).join("nvidia").join(d).join("include")).find(|f| f.is_dir());
    let installed = || {
        let home = std::env::var_os("CUDA_HOME").or_else(|| std::env::var_os("CUDA_PATH")).map_or_else(|| PathBuf::from("/usr/local/cuda"), PathBuf::from);
        Some(home.join("include")).filter(|f| f.is_dir())
    };
    folders.push(packaged.or_else(installed).ok_or("no CUDA headers (set CUDA_HOME)")?);
    Ok(folders)
}

#[cfg(test)]
mod tests {
    use super::{store_compiled, Module};

    fn module(folder: &std::path::Path, name: &str) -> Module {
        Module { name: name.into(), kernel: "custom_kernel_k_4".into(), source: String::new(), folder: folder.into(), library: "/x/lib/libmlx.so".into() }
    }

    #[test]
    fn a_long_module_name_is_cut_into_folders_as_mlx_does() {
        let short = module("/c".as_ref(), "custom_kernel_k_4_1f");
        assert_eq!(short.image_path(), std::path::Path::new("/c/custom_kernel_k_4_1f.ptx"));
        let name = "a".repeat(245) + &"b".repeat(245) + "c";
        let path = module("/c".as_ref(), &name).image_path();
        assert_eq!(path, std::path::Path::new("/c").join("a".repeat(245)).join("b".repeat(245)).join("c.ptx"));
        // Exactly 245 characters stays one file.
        let path = module("/c".as_ref(), &"d".repeat(245)).image_path();
        assert_eq!(path.parent(), Some(std::path::Path::new("/c")));
    }

    #[test]
    fn a_module_is_compiled_once_and_stored_with_its_kernel_name() {
        let folder = std::env::temp_dir().join(format!("sala-module-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        let m = module(&folder, &("m".repeat(300) + "_9a"));
        let mut calls = 0;
        let compiled = store_compiled(&m, |_| {
            calls += 1;
            Ok((vec![1, 2, 3], "_Z8loweredv".into()))
        });
        assert_eq!(compiled, Ok(true));
        let image = m.image_path();
        assert_eq!(std::fs::read(&image).unwrap(), [1, 2, 3]);
        assert_eq!(std::fs::read_to_string(image.with_extension("txt")).unwrap(), "mlx::core::cu::custom_kernel_k_4\t_Z8loweredv\n");
        // Nothing half-written is left beside them.
        let left: Vec<_> = std::fs::read_dir(image.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        // Found the second time: not compiled again, not rewritten.
        assert_eq!(store_compiled(&m, |_| unreachable!("compiled twice")), Ok(false));
        assert_eq!(calls, 1);
        // A failed compile stores nothing.
        let other = module(&folder, "custom_kernel_k_4_2b");
        assert!(store_compiled(&other, |_| Err("no".into())).is_err());
        assert!(!other.image_path().exists() && !other.image_path().with_extension("txt").exists());
        std::fs::remove_dir_all(&folder).unwrap();
    }

    #[test]
    fn only_custom_kernel_outputs_name_a_module() {
        // An ordinary operation's output is not a custom kernel's.
        let a = mlx_rs::Array::from_slice(&[1.0f32, 2.0], &[2]);
        let b = mlx_rs::ops::add(&a, &a).unwrap();
        assert!(Module::of(&b).is_none());
        assert!(Module::of(&a).is_none());
    }
}
