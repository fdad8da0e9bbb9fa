//! Device choice. MLX panics when asked for a GPU that its build does not have, so check first.

use super::error::{Error, Result};
use mlx_rs::Device;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

/// MLX-CUDA keeps recorded CUDA graphs (keyed by the sequence of kernels) and cuDNN attention
/// plans (keyed by the exact query and key shapes: every prefill chunk at a new offset is one) in
/// caches of 400 and 256, and counts every miss over the process's life: past twice the capacity
/// every later miss throws "Cache thrashing is happening". A server meets that within minutes
/// (on an H200, every prompt after a few hundred chunks failed), so the check is off and the
/// caches larger, unless the user set them. Must run before the first MLX call.
pub fn configure_runtime() {
    for (name, value) in runtime_defaults_missing(|name| std::env::var_os(name).is_some()) {
        std::env::set_var(name, value);
    }
}

/// The MLX settings [`configure_runtime`] gives, less those `is_set` says the user gave.
pub fn runtime_defaults_missing(is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    [("MLX_CUDA_GRAPH_CACHE_SIZE", "4096"), ("MLX_CUDA_SDPA_CACHE_SIZE", "1024"), ("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")]
        .into_iter()
        .filter(|(name, _)| !is_set(name))
        .collect()
}

/// Whether this libmlx has a usable GPU backend (Metal or CUDA).
pub fn gpu_available() -> bool {
    let mut available = false;
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let status = mlx_sys::mlx_device_is_available(&mut available, dev);
        mlx_sys::mlx_device_free(dev);
        status == 0 && available
    }
}

/// Which GPU backend this libmlx was built with, if any (fixed for the process, so asked of MLX
/// once: decoding asks at every token).
pub fn gpu_backend() -> Option<&'static str> {
    static BACKEND: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *BACKEND.get_or_init(|| {
        let (mut metal, mut cuda) = (false, false);
        unsafe {
            mlx_sys::mlx_metal_is_available(&mut metal);
            mlx_sys::mlx_cuda_is_available(&mut cuda);
        }
        if cuda {
            Some("cuda")
        } else if metal {
            Some("metal")
        } else {
            None
        }
    })
}

/// The compute dtype: the one asked for, else f32 on the CPU (MLX's CPU backend multiplies only
/// f32 through BLAS; bf16/f16 are far slower there), else the checkpoint's. (Here, below the
/// store, so that `sala show` estimates memory in the dtype a load would use.)
pub fn compute_dtype(asked: Option<mlx_rs::Dtype>, device: DeviceKind, storage: Option<mlx_rs::Dtype>) -> mlx_rs::Dtype {
    let default = match device {
        DeviceKind::Cpu => Some(mlx_rs::Dtype::Float32),
        DeviceKind::Gpu => storage,
    };
    asked.or(default).unwrap_or(mlx_rs::Dtype::Bfloat16)
}

/// The device `kind` names, by default the GPU when there is one.
pub fn or_default(kind: Option<DeviceKind>) -> DeviceKind {
    kind.unwrap_or(if gpu_available() { DeviceKind::Gpu } else { DeviceKind::Cpu })
}

/// Makes `kind` (default: the GPU when there is one) the device for all following work.
pub fn select(kind: Option<DeviceKind>) -> Result<DeviceKind> {
    let kind = or_default(kind);
    match kind {
        DeviceKind::Gpu if !gpu_available() => {
            return Err(Error::Usage(
                "--device gpu: this MLX build has no usable GPU (it is the CPU build, or no GPU was found); \
                 use --device cpu, or build against the CUDA/Metal MLX (see README)"
                    .into(),
            ))
        }
        DeviceKind::Gpu => {
            Device::set_default(&Device::gpu());
            bound_buffer_cache();
        }
        DeviceKind::Cpu => Device::set_default(&Device::cpu()),
    }
    SELECTED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(kind)
}

/// The share (%) of a CUDA GPU's memory MLX may keep in freed buffers for reuse. Under MLX's own
/// bound (95 %) a server's cache filled the card; CUDA's memory pool then still held what MLX freed,
/// and MLX emptied its cache at every allocation for the rest of the process (each step slower).
pub const CUDA_BUFFER_CACHE_SHARE: u64 = 10;

/// Bounds MLX's cache of freed buffers on CUDA to [`CUDA_BUFFER_CACHE_SHARE`] % of the GPU's memory.
fn bound_buffer_cache() {
    if gpu_backend() == Some("cuda") {
        if let Some(total) = gpu_info().and_then(|g| g.memory_bytes) {
            let bound = total / 100 * CUDA_BUFFER_CACHE_SHARE;
            let _ = mlx_rs::memory::set_cache_limit(bound as usize);
            BUFFER_CACHE_BOUND.store(bound, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

static BUFFER_CACHE_BOUND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The bound [`select`] set on MLX's cache of freed buffers (CUDA), in bytes; `None` where MLX
/// keeps its own.
pub fn buffer_cache_bound() -> Option<u64> {
    Some(BUFFER_CACHE_BOUND.load(std::sync::atomic::Ordering::Relaxed)).filter(|&b| b > 0)
}

/// Whether [`select`] ran: the process may have queued work on the device.
static SELECTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The version of the MLX library loaded (e.g. "0.32.2").
pub fn mlx_version() -> String {
    unsafe {
        let mut text = mlx_sys::mlx_string_new();
        let version = if mlx_sys::mlx_version(&mut text) == 0 {
            std::ffi::CStr::from_ptr(mlx_sys::mlx_string_data(text)).to_string_lossy().into_owned()
        } else {
            "unknown".into()
        };
        mlx_sys::mlx_string_free(text);
        version
    }
}

/// What MLX reports of GPU 0: its name and memory, where the backend tells.
pub struct GpuInfo {
    pub name: Option<String>,
    pub memory_bytes: Option<u64>,
    /// Metal: the memory the GPU may use without hurting performance (part of unified memory).
    pub working_set_bytes: Option<u64>,
}

/// [`GpuInfo`] of GPU 0, `None` when this libmlx has no usable GPU.
pub fn gpu_info() -> Option<GpuInfo> {
    if !gpu_available() {
        return None;
    }
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
        let mut info = mlx_sys::mlx_device_info_new();
        let ok = mlx_sys::mlx_device_info_get(&mut info, dev) == 0;
        let string = |key: &std::ffi::CStr| {
            let mut value: *const std::os::raw::c_char = std::ptr::null();
            (ok && mlx_sys::mlx_device_info_get_string(&mut value, info, key.as_ptr()) == 0 && !value.is_null())
                .then(|| std::ffi::CStr::from_ptr(value).to_string_lossy().into_owned())
        };
        let size = |key: &std::ffi::CStr| {
            let mut value = 0usize;
            (ok && mlx_sys::mlx_device_info_get_size(&mut value, info, key.as_ptr()) == 0).then_some(value as u64)
        };
        // Backends name the same things differently (Metal: memory_size; CUDA: total_memory).
        let result = GpuInfo {
            name: string(c"device_name"),
            memory_bytes: size(c"memory_size").or_else(|| size(c"total_memory")),
            working_set_bytes: size(c"max_recommended_working_set_size"),
        };
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(dev);
        Some(result)
    }
}

/// Compute units of GPU 0, which kernels size their grids by: streaming multiprocessors on CUDA
/// (from the driver), GPU cores on Metal (from the IORegistry); `None` where the device does not
/// say (MLX reports neither). Asked once.
pub fn gpu_compute_units() -> Option<u32> {
    static UNITS: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UNITS.get_or_init(|| match gpu_backend() {
        Some("cuda") => cuda_multiprocessors(),
        Some("metal") => metal_gpu_cores(),
        _ => None,
    })
}

/// CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT of device 0.
fn cuda_multiprocessors() -> Option<u32> {
    const MULTIPROCESSOR_COUNT: i32 = 16;
    cuda_device_attribute(MULTIPROCESSOR_COUNT).and_then(|n| u32::try_from(n).ok()).filter(|&n| n > 0)
}

/// Device 0's compute capability (major, minor), e.g. (9, 0) on Hopper; `None` off CUDA.
pub fn cuda_compute_capability() -> Option<(i32, i32)> {
    const MAJOR: i32 = 75;
    const MINOR: i32 = 76;
    if gpu_backend() != Some("cuda") {
        return None;
    }
    static CAPABILITY: std::sync::OnceLock<Option<(i32, i32)>> = std::sync::OnceLock::new();
    *CAPABILITY.get_or_init(|| Some((cuda_device_attribute(MAJOR)?, cuda_device_attribute(MINOR)?)))
}

/// The CUDA driver library, always beside an NVIDIA driver (and already loaded by MLX), opened
/// once; `None` where there is none. Callers look up the driver API's functions in it.
pub fn cuda_driver() -> Option<&'static libloading::Library> {
    static DRIVER: std::sync::OnceLock<Option<libloading::Library>> = std::sync::OnceLock::new();
    // SAFETY: loading the system's CUDA driver library runs no code of ours.
    DRIVER.get_or_init(|| unsafe { libloading::Library::new("libcuda.so.1") }.ok()).as_ref()
}

/// A CU_DEVICE_ATTRIBUTE of device 0, through [`cuda_driver`].
fn cuda_device_attribute(attribute_id: i32) -> Option<i32> {
    // SAFETY: the CUDA driver API's C signatures; each call is checked for CUDA_SUCCESS (0).
    unsafe {
        let lib = cuda_driver()?;
        let init = lib.get::<unsafe extern "C" fn(u32) -> i32>(b"cuInit\0").ok()?;
        let device_get = lib.get::<unsafe extern "C" fn(*mut i32, i32) -> i32>(b"cuDeviceGet\0").ok()?;
        let attribute = lib.get::<unsafe extern "C" fn(*mut i32, i32, i32) -> i32>(b"cuDeviceGetAttribute\0").ok()?;
        let (mut device, mut value) = (0, 0);
        if init(0) != 0 || device_get(&mut device, 0) != 0 || attribute(&mut value, attribute_id, device) != 0 {
            return None;
        }
        Some(value)
    }
}

/// The GPU driver's version where the backend has one apart from the OS: CUDA's (e.g. 13000).
/// Metal comes with the OS.
pub fn gpu_driver_version() -> Option<String> {
    if gpu_backend() != Some("cuda") {
        return None;
    }
    // SAFETY: cuDriverGetVersion(int*) of the CUDA driver API, checked for CUDA_SUCCESS (0).
    unsafe {
        let lib = cuda_driver()?;
        let get = lib.get::<unsafe extern "C" fn(*mut i32) -> i32>(b"cuDriverGetVersion\0").ok()?;
        let mut version = 0;
        (get(&mut version) == 0).then(|| version.to_string())
    }
}

/// The Apple GPU's core count (`gpu-core-count` of its AGXAccelerator in the IORegistry).
fn metal_gpu_cores() -> Option<u32> {
    let out = std::process::Command::new("ioreg").args(["-r", "-d", "1", "-k", "gpu-core-count", "-c", "AGXAccelerator"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("\"gpu-core-count\""))?;
    line.rsplit('=').next()?.trim().parse().ok().filter(|&n| n > 0)
}

pub fn describe(kind: DeviceKind) -> String {
    match kind {
        DeviceKind::Cpu => "cpu".into(),
        DeviceKind::Gpu => format!("gpu ({})", gpu_backend().unwrap_or("unknown")),
    }
}

/// Whether work currently runs on the CPU (the default device is the CPU).
pub fn on_cpu() -> bool {
    Device::try_default()
        .and_then(|d| d.get_type())
        .map(|t| matches!(t, mlx_rs::DeviceType::Cpu))
        .unwrap_or(true)
}

/// What [`await_kernel_compiles`] calls (set once, at load): `kernels::module_cache::settle`,
/// which the engine cannot name (it sits above).
static KERNEL_COMPILES: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Makes [`await_kernel_compiles`] wait through `wait` from now on.
pub fn use_kernel_compile_wait(wait: fn()) {
    let _ = KERNEL_COMPILES.set(wait);
}

/// Waits for GPU kernels launched in a graph and still compiling side by side elsewhere, before
/// the graph goes to MLX, which would otherwise compile each one it meets in turn. Cheap when
/// none is (every step asks).
pub fn await_kernel_compiles() {
    if let Some(wait) = KERNEL_COMPILES.get() {
        wait();
    }
}

/// Waits until the default stream's queued work is done, if a device was selected (a command
/// that never ran a model does not start one here). Called before the process exits: a step
/// still running on MLX's worker thread (decoding queues steps ahead of the token it hands out)
/// while the process tears MLX down can corrupt the heap.
fn settle() {
    if SELECTED.load(std::sync::atomic::Ordering::Relaxed) {
        super::encoder::drain();
        unsafe {
            mlx_sys::mlx_synchronize_default();
        }
    }
}

/// Called as the process ends with `code`: waits for the device's queued work ([`settle`]), then
/// on CUDA ends the process at once, without the C++ teardown. A CUDA handle released during that
/// teardown after the CUDA runtime unloaded aborts the process after its output ("Destroy(handle_)
/// failed: driver shutting down": once in 26 golden runs, on a loaded H100).
pub fn finish(code: i32) {
    use std::io::Write;
    settle();
    if SELECTED.load(std::sync::atomic::Ordering::Relaxed) && gpu_backend() == Some("cuda") {
        // Nothing buffered is lost: Rust's own buffers are flushed here, and files were closed
        // (and renamed into place) by the commands that wrote them.
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        unsafe { libc::_exit(code) }
    }
}

#[cfg(test)]
mod tests {
    use super::runtime_defaults_missing;

    #[test]
    fn mlx_runtime_defaults_leave_what_the_user_set() {
        let all = runtime_defaults_missing(|_| false);
        assert!(all.contains(&("MLX_ENABLE_CACHE_THRASHING_CHECK", "0")) && all.contains(&("MLX_CUDA_SDPA_CACHE_SIZE", "1024")), "{all:?}");
        let some = runtime_defaults_missing(|name| name == "MLX_ENABLE_CACHE_THRASHING_CHECK");
        assert_eq!(some.len(), all.len() - 1);
        assert!(some.iter().all(|(name, _)| *name != "MLX_ENABLE_CACHE_THRASHING_CHECK"));
    }
}
