//! Custom GPU kernels through MLX's run-time compiled kernels (`mlx_fast_cuda_kernel` on CUDA,
//! `mlx_fast_metal_kernel` on Metal). A kernel's source lives in `cuda/NAME.cu` and
//! `metal/NAME.metal` as an ordinary device function; MLX writes the `__global__`/`kernel`
//! signature from the input and output names, and the short body given here calls that function.

use crate::engine::device;
use mlx_rs::{ops::indexing::TryIndexOp, Array, Dtype, StreamOrDevice};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

/// Where kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

impl Backend {
    /// The name users see ("cpu", "cuda", "metal").
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        }
    }
}

/// Whether the CUDA GPU has compute capability 9 (wgmma, and `sm_90a` code, are Hopper's alone).
pub fn hopper() -> bool {
    device::cuda_compute_capability().is_some_and(|(major, _)| major == 9)
}

/// The backend of the current default device. `SALA_KERNELS=off` reports the CPU for a GPU too,
/// so every kernel takes its MLX-ops version (for A/B measurements and bisecting).
pub fn backend() -> Backend {
    // Asked on every quantized product and attention call: the build's GPU backend and the
    // environment switch are fixed for the process, so look them up once.
    static GPU: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();
    let gpu = *GPU.get_or_init(|| {
        if std::env::var("SALA_KERNELS").is_ok_and(|v| v == "off" || v == "0") {
            return Backend::Cpu;
        }
        match device::gpu_backend() {
            Some("cuda") => Backend::Cuda,
            Some("metal") => Backend::Metal,
            _ => Backend::Cpu,
        }
    });
    if device::on_cpu() {
        Backend::Cpu
    } else {
        gpu
    }
}

/// One kernel's source for both GPU backends. `cuda_body`/`metal_body` call the device function
/// defined in the shared source with the named inputs and outputs.
pub struct KernelSource {
    pub name: &'static str,
    pub inputs: &'static [&'static str],
    pub outputs: &'static [&'static str],
    pub cuda_header: &'static str,
    pub cuda_body: &'static str,
    pub metal_header: &'static str,
    pub metal_body: &'static str,
    /// Whether MLX copies inputs that are not row-contiguous before the launch. Kernels taking
    /// [`shape_args`] need `false` (the copy would materialise the broadcast) and must either
    /// read their other inputs through `NAME_strides` or be given contiguous ones.
    pub contiguous_inputs: bool,
    /// Bytes of dynamic shared memory a CUDA launch gets (`extern __shared__`; MLX raises the
    /// kernel's limit above 48 KB); 0 for kernels with static shared memory only.
    pub shared_memory: i32,
}

/// Integers for a kernel without an array written by the host: the shape `[v₀+1, v₁+1, …]` of a
/// zero-strided broadcast of a device constant. MLX passes input shapes by value with the
/// launch, so the kernel reads `vᵢ` as `NAME_shape[i] - 1` and never touches the data. (On CUDA
/// MLX keeps arrays in managed memory: a small parameter array written by the host costs the GPU
/// a page fault where the kernel reads it; eval/results/kernel-notes.md.)
///
/// The last few are kept and handed out again: every layer of a decode step passes the same
/// positions and lengths, and each new array is an operation the host pays for.
pub fn shape_args(values: &[usize]) -> mlx_rs::error::Result<Array> {
    debug_assert!(values.len() <= MAX_SHAPE_ARGS);
    const KEPT: usize = 8;
    thread_local! {
        static RECENT: RefCell<Vec<(Vec<usize>, Array)>> = const { RefCell::new(Vec::new()) };
    }
    if let Some(hit) = RECENT.with(|r| r.borrow().iter().find(|(v, _)| v == values).map(|(_, a)| a.clone())) {
        return Ok(hit);
    }
    let shape: Vec<i32> = values.iter().map(|&v| v as i32 + 1).collect();
    let array = mlx_rs::ops::broadcast_to(crate::engine::ops::scalar(0.0, Dtype::Int32)?, &shape)?;
    RECENT.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() == KEPT {
            r.remove(0);
        }
        r.push((values.to_vec(), array.clone()));
    });
    Ok(array)
}

/// A CUDA-only kernel that takes a set of buffers per slot (a sequence of a decode batch): the
/// source for one slot count, as [`slot_source`] builds it. Its inputs are read through their
/// strides or are whole arrays, and its integers may come as [`shape_args`] broadcasts, so MLX
/// copies none of them (`contiguous_inputs: false`).
pub struct SlotKernel {
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub cuda_header: &'static str,
    pub cuda_body: String,
}

/// The source of a [`SlotKernel`] for `n` slots (1 ..= [`MAX_SHAPE_ARGS`]), all counts built by
/// `make` on first use and kept in `sources`: one source per count, so a launch passes only its
/// own buffers (every input is arguments the host sets up at each launch).
pub fn slot_source(
    sources: &'static std::sync::OnceLock<Vec<KernelSource>>,
    n: usize,
    make: impl Fn(usize) -> SlotKernel,
) -> &'static KernelSource {
    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }
    fn leak_all(names: Vec<String>) -> &'static [&'static str] {
        Box::leak(names.into_iter().map(leak).collect::<Vec<_>>().into_boxed_slice())
    }
    let sources = sources.get_or_init(|| {
        (1..=MAX_SHAPE_ARGS)
            .map(|n| {
                let kernel = make(n);
                KernelSource {
                    name: leak(kernel.name),
                    inputs: leak_all(kernel.inputs),
                    outputs: leak_all(kernel.outputs),
                    cuda_header: kernel.cuda_header,
                    cuda_body: leak(kernel.cuda_body),
                    metal_header: "",
                    metal_body: "",
                    contiguous_inputs: false,
                    shared_memory: 0,
                }
            })
            .collect()
    });
    &sources[n - 1]
}

/// A per-sequence integer that the device holds (`engine::cache::StepCounts`, a fixed decode
/// step), one `[1]` int32 array per sequence, as one `[n]` array for a kernel that reads it in
/// place of [`shape_args`]: `None` when the sequences' integers are the host's (any is `None`).
pub fn device_counts<'a>(counts: impl Iterator<Item = Option<&'a Array>>) -> mlx_rs::error::Result<Option<Array>> {
    let Some(all) = counts.collect::<Option<Vec<&Array>>>() else { return Ok(None) };
    match all.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((*one).clone())),
        many => Ok(Some(mlx_rs::ops::concatenate(&many.iter().map(|a| (*a).clone()).collect::<Vec<_>>(), 0)?)),
    }
}

/// Integers one [`shape_args`] array carries (MLX's CUDA kernels take shapes of up to 10 axes).
pub const MAX_SHAPE_ARGS: usize = 8;

/// `launch` on consecutive pieces of at most `per` of `items` (a slot kernel's sequences), each
/// with the matching rows of `rows` (axis 0, one row per item) and its first item's index: one
/// launch, with `rows` as it is, where all fit.
pub fn in_pieces<S, R>(
    rows: &Array,
    items: &[S],
    per: usize,
    mut launch: impl FnMut(&Array, usize, &[S]) -> mlx_rs::error::Result<R>,
) -> mlx_rs::error::Result<Vec<R>> {
    if items.len() <= per {
        return Ok(vec![launch(rows, 0, items)?]);
    }
    items
        .chunks(per)
        .enumerate()
        .map(|(i, piece)| {
            let start = i * per;
            launch(&rows.try_index(start as i32..(start + piece.len()) as i32)?, start, piece)
        })
        .collect()
}

/// Runs `f` with the thread-local `setting` holding `value`, then puts back what it held: how the
/// kernel benchmark's sweeps force a launch shape (a tiling, a split count); the model never sets
/// one, so the kernels take their defaults.
pub fn with_setting<T: Copy + 'static, R>(
    setting: &'static std::thread::LocalKey<std::cell::Cell<Option<T>>>,
    value: Option<T>,
    f: impl FnOnce() -> R,
) -> R {
    let before = setting.with(|s| s.replace(value));
    let r = f();
    setting.with(|s| s.set(before));
    r
}

/// The largest power of two at most `v` (at least 1): launch shapes taken from a few compiled
/// variants (each distinct template argument compiles a kernel).
pub fn pow2_floor(v: i32) -> i32 {
    1 << (31 - (v.max(1) as u32).leading_zeros())
}

/// A compile-time argument (`constexpr int` / `using T =` in the generated source).
#[derive(Clone, Copy)]
pub enum TemplateArg {
    Int(i32),
    Bool(bool),
    Type(Dtype),
}

/// The kernel variants (a kernel with its template arguments) this process has launched, in the
/// order first met: MLX compiles each at its first launch (seconds on CUDA, where
/// [`super::module_cache`] keeps the result for later processes), and the evaluation that meets
/// it waits.
static VARIANTS: std::sync::LazyLock<std::sync::Mutex<(Vec<String>, std::collections::HashSet<u64>)>> = std::sync::LazyLock::new(Default::default);

thread_local! {
    // The variants this thread has launched: a launch takes no lock unless its variant is new here.
    static SEEN_HERE: RefCell<std::collections::HashSet<u64>> = RefCell::new(std::collections::HashSet::new());
}

/// A variant's key, cheap enough for every launch (a decode step makes ~300).
fn variant_key(kernel: &str, template: &[(&str, TemplateArg)], types: impl Iterator<Item = Dtype>) -> u64 {
    let mix = |h: u64, x: u64| (h.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    let text = |h: u64, s: &str| {
        s.as_bytes().chunks(8).fold(mix(h, s.len() as u64), |h, c| {
            let mut word = [0u8; 8];
            word[..c.len()].copy_from_slice(c);
            mix(h, u64::from_le_bytes(word))
        })
    };
    let h = template.iter().fold(text(0, kernel), |h, (name, arg)| {
        let value = match arg {
            TemplateArg::Int(v) => *v as u32 as u64,
            TemplateArg::Bool(v) => 1 << 32 | *v as u64,
            TemplateArg::Type(d) => 2 << 32 | *d as u32 as u64,
        };
        mix(text(h, name), value)
    });
    types.fold(h, |h, d| mix(h, 3 << 32 | d as u32 as u64))
}

/// Records `kernel` with `template` (and its inputs' and outputs' `types`) as launched; true the
/// first time in the process.
fn note_variant(kernel: &str, template: &[(&str, TemplateArg)], types: impl Iterator<Item = Dtype>) -> bool {
    let key = variant_key(kernel, template, types);
    if !SEEN_HERE.with(|seen| seen.borrow_mut().insert(key)) {
        return false;
    }
    let mut seen = VARIANTS.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.1.insert(key) {
        return false;
    }
    let args: Vec<String> = template
        .iter()
        .map(|(name, arg)| match arg {
            TemplateArg::Int(v) => format!("{name}={v}"),
            TemplateArg::Bool(v) => format!("{name}={v}"),
            TemplateArg::Type(d) => format!("{name}={d:?}"),
        })
        .collect();
    seen.0.push(format!("{kernel}<{}>", args.join(",")));
    true
}

/// How many kernel variants this process has launched (see [`variants_from`]).
pub fn variants_launched() -> usize {
    VARIANTS.lock().unwrap_or_else(|e| e.into_inner()).0.len()
}

/// The variants first launched after the first `first`, named `kernel<ARG=value,…>`.
pub fn variants_from(first: usize) -> Vec<String> {
    VARIANTS.lock().unwrap_or_else(|e| e.into_inner()).0.get(first..).map(<[String]>::to_vec).unwrap_or_default()
}

/// How one call runs: the grid and thread group are counted in threads (as in Metal), the
/// outputs are allocated with the given shapes and types (uninitialised unless `init` is set).
pub struct Launch<'a> {
    pub grid: (i32, i32, i32),
    pub threads: (i32, i32, i32),
    pub outputs: Vec<(Vec<i32>, Dtype)>,
    pub template: Vec<(&'a str, TemplateArg)>,
    pub init: Option<f32>,
}

struct Compiled {
    backend: Backend,
    handle: *mut std::ffi::c_void,
}

impl Drop for Compiled {
    fn drop(&mut self) {
        unsafe {
            match self.backend {
                Backend::Cuda => mlx_sys::mlx_fast_cuda_kernel_free(mlx_sys::mlx_fast_cuda_kernel { ctx: self.handle }),
                Backend::Metal => {
                    mlx_sys::mlx_fast_metal_kernel_free(mlx_sys::mlx_fast_metal_kernel { ctx: self.handle })
                }
                Backend::Cpu => {}
            }
        }
    }
}

thread_local! {
    // MLX kernel objects are not thread-safe handles; each thread keeps its own.
    static KERNELS: RefCell<HashMap<(&'static str, u8), Compiled>> = RefCell::new(HashMap::new());
}

fn cstring(s: &str) -> CString {
    CString::new(s).expect("kernel sources and names hold no NUL byte")
}

fn string_vector(items: &[&str]) -> mlx_sys::mlx_vector_string {
    unsafe {
        let v = mlx_sys::mlx_vector_string_new();
        for item in items {
            let c = cstring(item);
            mlx_sys::mlx_vector_string_append_value(v, c.as_ptr());
        }
        v
    }
}

/// `source` without its comments, indentation and blank lines: what MLX is given (inline on Metal,
/// in a file on CUDA, see [`header_include`]). (No `//` occurs inside a string literal of our
/// sources; the scan skips string literals anyway.)
fn minified(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut end = line.len();
        for (i, c) in line.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '/' if !in_string && line[i + 1..].starts_with('/') => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let code = line[..end].trim();
        if !code.is_empty() {
            out.push_str(code);
            out.push('\n');
        }
    }
    out
}

/// `header` as an `#include` of a file holding it, named by its content's hash in the temporary
/// directory: MLX writes a custom kernel's whole source into every launch, and the host's time
/// per launch grows with it (eval/results/kernel-notes.md).
/// The compiler reads the file once, at the kernel's first launch. `None` (the header goes
/// inline) when the file cannot be written or its path cannot be quoted.
fn header_include(header: &str) -> Option<String> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    header.hash(&mut h);
    let dir = std::env::temp_dir().join(format!("sala-cuda-{}", env!("CARGO_PKG_VERSION")));
    let path = dir.join(format!("{:016x}.cuh", h.finish()));
    let quoted = path.to_str().filter(|p| path.is_absolute() && p.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '\\'))?;
    // Written whole (aside, then renamed): another process may be reading it.
    let written = std::fs::read_to_string(&path).is_ok_and(|s| s == header)
        || (std::fs::create_dir_all(&dir).is_ok() && crate::engine::checkpoint::write_whole(&path, header.as_bytes()).is_ok());
    written.then(|| format!("#include \"{quoted}\"\n"))
}

fn compile(source: &KernelSource, backend: Backend) -> Compiled {
    let name = cstring(source.name);
    let inputs = string_vector(source.inputs);
    let outputs = string_vector(source.outputs);
    let handle = unsafe {
        match backend {
            Backend::Cuda => {
                let header = minified(source.cuda_header);
                let header = if header.is_empty() { header } else { header_include(&header).unwrap_or(header) };
                let (body, header) = (cstring(source.cuda_body), cstring(&header));
                mlx_sys::mlx_fast_cuda_kernel_new(name.as_ptr(), inputs, outputs, body.as_ptr(), header.as_ptr(), source.contiguous_inputs, source.shared_memory)
                    .ctx
            }
            Backend::Metal => {
                let (body, header) = (cstring(source.metal_body), cstring(&minified(source.metal_header)));
                mlx_sys::mlx_fast_metal_kernel_new(name.as_ptr(), inputs, outputs, body.as_ptr(), header.as_ptr(), source.contiguous_inputs, false)
                    .ctx
            }
            Backend::Cpu => std::ptr::null_mut(),
        }
    };
    unsafe {
        mlx_sys::mlx_vector_string_free(inputs);
        mlx_sys::mlx_vector_string_free(outputs);
    }
    Compiled { backend, handle }
}

fn launch_error(source: &KernelSource, what: &str) -> mlx_rs::error::Exception {
    mlx_rs::error::Exception::custom(format!("kernel `{}`: {what}", source.name))
}

/// Runs `source` on the current GPU backend. Compilation happens lazily inside MLX at the first
/// evaluation; its errors surface there with the generated source's line numbers.
pub fn apply(source: &'static KernelSource, inputs: &[&Array], launch: Launch) -> mlx_rs::error::Result<Vec<Array>> {
    let backend = backend();
    if backend == Backend::Cpu {
        return Err(launch_error(source, "no GPU backend (the MLX-ops version runs on the CPU)"));
    }
    if inputs.len() != source.inputs.len() || launch.outputs.len() != source.outputs.len() {
        return Err(launch_error(source, "wrong number of inputs or outputs"));
    }
    // The types of the inputs and outputs are in the generated signature: part of the variant.
    let types = inputs.iter().map(|a| a.dtype()).chain(launch.outputs.iter().map(|o| o.1));
    let first = note_variant(source.name, &launch.template, types);
    let outputs = KERNELS.with(|kernels| {
        let mut kernels = kernels.borrow_mut();
        let compiled = kernels.entry((source.name, backend as u8)).or_insert_with(|| compile(source, backend));
        if compiled.handle.is_null() {
            return Err(launch_error(source, "MLX could not create the kernel"));
        }
        unsafe { run(compiled, source, inputs, &launch) }
    })?;
    if first && backend == Backend::Cuda {
        super::module_cache::prepare(&outputs[0]);
    }
    Ok(outputs)
}

unsafe fn run(
    compiled: &Compiled,
    source: &KernelSource,
    inputs: &[&Array],
    launch: &Launch,
) -> mlx_rs::error::Result<Vec<Array>> {
    use mlx_sys::*;
    let cuda = compiled.backend == Backend::Cuda;
    let (cuda_cfg, metal_cfg) = if cuda {
        (mlx_fast_cuda_kernel_config_new(), mlx_fast_metal_kernel_config { ctx: std::ptr::null_mut() })
    } else {
        (mlx_fast_cuda_kernel_config { ctx: std::ptr::null_mut() }, mlx_fast_metal_kernel_config_new())
    };
    let mut status = 0;
    for (shape, dtype) in &launch.outputs {
        let dtype = *dtype as mlx_dtype;
        status |= if cuda {
            mlx_fast_cuda_kernel_config_add_output_arg(cuda_cfg, shape.as_ptr(), shape.len(), dtype)
        } else {
            mlx_fast_metal_kernel_config_add_output_arg(metal_cfg, shape.as_ptr(), shape.len(), dtype)
        };
    }
    let (g, t) = (launch.grid, launch.threads);
    status |= if cuda {
        mlx_fast_cuda_kernel_config_set_grid(cuda_cfg, g.0, g.1, g.2)
            | mlx_fast_cuda_kernel_config_set_thread_group(cuda_cfg, t.0, t.1, t.2)
    } else {
        mlx_fast_metal_kernel_config_set_grid(metal_cfg, g.0, g.1, g.2)
            | mlx_fast_metal_kernel_config_set_thread_group(metal_cfg, t.0, t.1, t.2)
    };
    if let Some(init) = launch.init {
        status |= if cuda {
            mlx_fast_cuda_kernel_config_set_init_value(cuda_cfg, init)
        } else {
            mlx_fast_metal_kernel_config_set_init_value(metal_cfg, init)
        };
    }
    for (name, arg) in &launch.template {
        // On the stack: a launch sets up to a dozen of these, and a decode step makes ~300 launches.
        let mut buffer = [0u8; 64];
        let owned;
        let name: &std::ffi::CStr = if name.len() < buffer.len() && !name.contains('\0') {
            buffer[..name.len()].copy_from_slice(name.as_bytes());
            std::ffi::CStr::from_bytes_until_nul(&buffer).expect("NUL-terminated")
        } else {
            owned = cstring(name);
            &owned
        };
        status |= match (*arg, cuda) {
            (TemplateArg::Int(v), true) => mlx_fast_cuda_kernel_config_add_template_arg_int(cuda_cfg, name.as_ptr(), v),
            (TemplateArg::Int(v), false) => mlx_fast_metal_kernel_config_add_template_arg_int(metal_cfg, name.as_ptr(), v),
            (TemplateArg::Bool(v), true) => mlx_fast_cuda_kernel_config_add_template_arg_bool(cuda_cfg, name.as_ptr(), v),
            (TemplateArg::Bool(v), false) => {
                mlx_fast_metal_kernel_config_add_template_arg_bool(metal_cfg, name.as_ptr(), v)
            }
            (TemplateArg::Type(d), true) => {
                mlx_fast_cuda_kernel_config_add_template_arg_dtype(cuda_cfg, name.as_ptr(), d as mlx_dtype)
            }
            (TemplateArg::Type(d), false) => {
                mlx_fast_metal_kernel_config_add_template_arg_dtype(metal_cfg, name.as_ptr(), d as mlx_dtype)
            }
        };
    }
    let input_vector = crate::engine::ops::ArrayList::of(inputs);
    let mut outputs = crate::engine::ops::ArrayList::empty();
    let stream = StreamOrDevice::default();
    if status == 0 {
        status = if cuda {
            mlx_fast_cuda_kernel_apply(
                outputs.as_mut_ptr(),
                mlx_fast_cuda_kernel { ctx: compiled.handle },
                input_vector.as_ptr(),
                cuda_cfg,
                stream.as_ref().as_ptr(),
            )
        } else {
            mlx_fast_metal_kernel_apply(
                outputs.as_mut_ptr(),
                mlx_fast_metal_kernel { ctx: compiled.handle },
                input_vector.as_ptr(),
                metal_cfg,
                stream.as_ref().as_ptr(),
            )
        };
    }
    let result = if status == 0 { outputs.into_arrays() } else { Vec::new() };
    if cuda {
        mlx_fast_cuda_kernel_config_free(cuda_cfg);
    } else {
        mlx_fast_metal_kernel_config_free(metal_cfg);
    }
    if status != 0 || result.len() != source.outputs.len() {
        return Err(launch_error(source, "MLX refused the launch (see MLX's message above)"));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use mlx_rs::Array;

    #[test]
    fn each_kernel_variant_is_counted_once_and_named_with_its_arguments() {
        use super::{variants_from, variants_launched, TemplateArg};
        use mlx_rs::Dtype::{Bfloat16, Float32};
        let note_variant = |k: &str, t: &[(&str, TemplateArg)]| super::note_variant(k, t, [Bfloat16, Float32].into_iter());
        let before = variants_launched();
        let rows = |n| [("ROWS", TemplateArg::Int(n)), ("HI", TemplateArg::Bool(n > 8)), ("T", TemplateArg::Type(mlx_rs::Dtype::Bfloat16))];
        assert!(note_variant("test_variant_qmv", &rows(4)));
        assert!(!note_variant("test_variant_qmv", &rows(4)));
        assert!(note_variant("test_variant_qmv", &rows(16)));
        assert!(note_variant("test_variant_other", &rows(4)));
        assert!(!note_variant("test_variant_qmv", &rows(16)));
        // Another thread's first launch of a variant already met compiles nothing.
        assert!(!std::thread::spawn(move || super::note_variant("test_variant_qmv", &rows(4), [Bfloat16, Float32].into_iter())).join().unwrap());
        // Other input or output types generate another signature: another variant.
        assert!(super::note_variant("test_variant_qmv", &rows(4), [Float32, Float32].into_iter()));
        let key = |k: &str| super::variant_key(k, &rows(4), std::iter::empty());
        assert_ne!(key("test_variant_qmv"), key("test_variant_qmw"));
        let met = variants_from(before);
        let ours: Vec<&String> = met.iter().filter(|v| v.starts_with("test_variant_")).collect();
        assert_eq!(ours.len(), 4, "{met:?}");
        assert_eq!(ours[0], "test_variant_qmv<ROWS=4,HI=false,T=Bfloat16>");
        assert_eq!(ours[1], "test_variant_qmv<ROWS=16,HI=true,T=Bfloat16>");
        assert!(variants_launched() >= before + 4);
    }

    #[test]
    fn pieces_pair_items_with_their_rows() {
        let rows = Array::from_slice(&(0..19).collect::<Vec<i32>>(), &[19, 1]);
        let items: Vec<usize> = (0..19).collect();
        let pieces = super::in_pieces(&rows, &items, 8, |part, start, piece| {
            let values: Vec<i32> = part.as_slice().to_vec();
            Ok((start, piece.to_vec(), values))
        })
        .unwrap();
        assert_eq!(pieces.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 8, 16]);
        for (start, piece, values) in &pieces {
            assert_eq!(piece.len(), values.len());
            assert!(piece.iter().zip(values).all(|(&i, &v)| i as i32 == v && i >= *start));
        }
        assert_eq!(pieces.iter().flat_map(|p| p.1.clone()).collect::<Vec<_>>(), items);
        // All in one launch: the rows as they are, not a slice of them.
        let whole = super::in_pieces(&rows, &items[..8], 8, |part, start, piece| Ok((part.shape().to_vec(), start, piece.len()))).unwrap();
        assert_eq!(whole, [(vec![19, 1], 0, 8)]);
    }

    #[test]
    fn minified_source_keeps_code_and_strings() {
        let source = "// a comment\n  int x = 1; // trailing\n\n  #define S \"a // b\"\n  y = x / 2;\n";
        assert_eq!(super::minified(source), "int x = 1;\n#define S \"a // b\"\ny = x / 2;\n");
    }

    #[test]
    fn header_goes_to_a_file_named_by_its_content() {
        let header = format!("__device__ int sala_header_test_{}() {{ return 1; }}\n", std::process::id());
        let line = super::header_include(&header).expect("the temporary directory is writable");
        let path = line.strip_prefix("#include \"").and_then(|l| l.strip_suffix("\"\n")).expect("one include line");
        assert!(std::path::Path::new(path).is_absolute());
        assert_eq!(std::fs::read_to_string(path).unwrap(), header);
        // The same content, the same file; another content, another file.
        assert_eq!(super::header_include(&header).unwrap(), line);
        assert_ne!(super::header_include(&format!("{header} ")).unwrap(), line);
    }
}
