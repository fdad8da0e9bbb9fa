//! The kernels' self-check. Our kernels are compiled at run time, and the Metal twins had never run
//! when they were written, so none is trusted blindly: the first time a process would launch a
//! kernel on a GPU backend, it runs the kernel once on a small fixed input against its MLX-ops
//! version. A compile failure, any other error, or a result beyond [`TOLERANCE`] switches that
//! kernel off for the rest of the process, with one warning on stderr, and its callers take the
//! MLX-ops version (docs/adding-a-kernel.md, "The self-check"). `sala doctor` runs every check.
//!
//! Each kernel registers a [`KernelCheck`] beside its launch; its public function asks
//! [`enabled`] after its own shape checks, before it launches.
//!
//! MLX compiles custom kernels again in every process (seconds each on CUDA), so a check passed by
//! this very binary on this GPU, driver and MLX is remembered on disk ([`Memo`]) and not run again
//! by later processes; a failed one is never remembered. `sala doctor` always checks afresh.
//!
//! A check evaluates its kernels as soon as it launches them, so on a machine that has compiled
//! none of them yet the checks would compile one kernel at a time, for minutes.
//! [`compile_ahead`] first runs the checks a process will need launching their kernels only, so
//! that the module cache's pool compiles them side by side; each check then loads its kernels.

use super::custom::{backend, Backend};
use crate::engine::ops::to_vec_f32;
use mlx_rs::{error::Result, Array, Dtype};
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::collections::btree_map::{BTreeMap, Entry};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Relative error ‖kernel − oracle‖ / ‖oracle‖ up to which a check's float outputs agree: the GPU
/// tests' tolerance for half precision. Checks run in bfloat16 where the kernel takes it, and
/// MLX's CUDA backend runs float32 products in TF32 by default, so float32 outputs are held to it
/// too. Integer outputs, and infinities, must be equal.
pub const TOLERANCE: f64 = 1e-2;

/// A check's outcome: `Err` holds why the kernel is switched off, in one line.
pub type Verdict = std::result::Result<(), String>;

/// One kernel's self-check, a static beside the kernel's launch.
pub struct KernelCheck {
    /// The kernel as warnings and `sala doctor` name it.
    pub name: &'static str,
    /// The backends it has a source for.
    pub backends: &'static [Backend],
    /// Launches the kernel and its MLX-ops version on a small fixed input and compares them
    /// ([`verify`]).
    pub run: fn() -> Verdict,
}

/// The backends of a kernel with a CUDA source and a Metal twin.
pub const CUDA_AND_METAL: &[Backend] = &[Backend::Cuda, Backend::Metal];
/// The backends of a CUDA-only kernel (tensor cores, or more buffers than Metal takes).
pub const CUDA_ONLY: &[Backend] = &[Backend::Cuda];

/// Where a kernel stands on a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// It does not run there: the CPU (or `SALA_KERNELS=off`), or a backend it has no source for.
    NotUsed,
    /// Not needed yet in this process.
    Unchecked,
    /// Its check is running; callers meanwhile take the MLX-ops version.
    Checking,
    /// It agreed with its MLX-ops version, and runs.
    Verified,
    /// It failed its check (the reason): the MLX-ops version runs for the rest of the process.
    Disabled(String),
}

/// Checks passed before, kept in a file: one line per kernel and backend, each naming the binary
/// (a hash of its bytes: kernel sources, launch variants and the check itself are in it), the MLX
/// version, the GPU and its driver. A line is trusted only if all of them match this process.
pub struct Memo {
    path: PathBuf,
    /// What a line must say besides the kernel and backend.
    setting: String,
}

impl Memo {
    /// A memo at `path` for checks made in `setting` (what must match for a verdict to hold).
    pub fn new(path: PathBuf, setting: String) -> Self {
        Self { path, setting }
    }

    /// This machine's memo (`$XDG_CACHE_HOME/sala/kernel-checks`, else `~/.cache/…`); `None` when
    /// there is no cache folder or the binary cannot be read.
    fn this_machine() -> Option<&'static Memo> {
        static MEMO: OnceLock<Option<Memo>> = OnceLock::new();
        MEMO.get_or_init(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            let binary = std::fs::read(std::env::current_exe().ok()?).ok()?;
            let gpu = crate::engine::device::gpu_info().and_then(|g| g.name).unwrap_or_default();
            let setting = format!(
                "binary={:016x} mlx={} gpu={} driver={} os={}",
                xxhash_rust::xxh3::xxh3_64(&binary),
                crate::engine::device::mlx_version(),
                gpu.replace(' ', "_"),
                crate::engine::device::gpu_driver_version().unwrap_or_default(),
                sysinfo::System::kernel_version().unwrap_or_default().replace(' ', "_"),
            );
            Some(Memo::new(cache.join("sala").join("kernel-checks"), setting))
        })
        .as_ref()
    }

    fn line(&self, kernel: &str, backend: Backend) -> String {
        format!("{kernel} {} {}", backend.name(), self.setting)
    }

    /// Whether `kernel` passed its check on `backend` in this setting before.
    pub fn holds(&self, kernel: &str, backend: Backend) -> bool {
        let line = self.line(kernel, backend);
        std::fs::read_to_string(&self.path).is_ok_and(|text| text.lines().any(|l| l == line))
    }

    /// Remembers that `kernel` passed on `backend`; a file that cannot be written is left alone
    /// (later processes check again). Written whole, so a reader never sees half a file.
    pub fn record(&self, kernel: &str, backend: Backend) {
        let line = self.line(kernel, backend);
        let old = std::fs::read_to_string(&self.path).unwrap_or_default();
        // Lines of other binaries, GPUs or drivers stay, within reason.
        let mut lines: Vec<&str> = old.lines().filter(|l| *l != line).collect();
        let keep_from = lines.len().saturating_sub(999);
        lines.drain(..keep_from);
        lines.push(&line);
        if self.path.parent().is_some_and(|dir| std::fs::create_dir_all(dir).is_ok()) {
            let _ = crate::engine::checkpoint::write_whole(&self.path, (lines.join("\n") + "\n").as_bytes());
        }
    }
}

/// Where a registry keeps verdicts across processes.
enum Memory {
    /// Nowhere: every process checks.
    None,
    /// [`Memo::this_machine`].
    ThisMachine,
    At(Memo),
}

/// Each kernel's [`Status`] per backend, for one process (see [`enabled`]); its own instances serve
/// tests.
pub struct Registry {
    states: Mutex<BTreeMap<(&'static str, Backend), Status>>,
    warn: fn(&str),
    memory: Memory,
}

impl Registry {
    /// A registry that reports each kernel it switches off through `warn`, once, and remembers
    /// nothing across processes.
    pub const fn new(warn: fn(&str)) -> Self {
        Self { states: Mutex::new(BTreeMap::new()), warn, memory: Memory::None }
    }

    /// [`Registry::new`] remembering passed checks in `memo`.
    pub fn with_memo(warn: fn(&str), memo: Memo) -> Self {
        Self { states: Mutex::new(BTreeMap::new()), warn, memory: Memory::At(memo) }
    }

    fn memo(&self) -> Option<&Memo> {
        match &self.memory {
            Memory::None => None,
            Memory::ThisMachine => Memo::this_machine(),
            Memory::At(memo) => Some(memo),
        }
    }

    /// Whether `check`'s kernel may run on `backend`. The first call for a kernel and backend runs
    /// its check, unless the memo says this binary passed it here before; calls while it runs
    /// (another thread, or the check itself) answer no.
    pub fn enabled(&self, check: &KernelCheck, backend: Backend) -> bool {
        self.decide(check, backend, false)
    }

    /// Runs `check` now whatever is known (`sala doctor`), and says whether the kernel may run.
    pub fn recheck(&self, check: &KernelCheck, backend: Backend) -> bool {
        self.decide(check, backend, true)
    }

    fn decide(&self, check: &KernelCheck, backend: Backend, afresh: bool) -> bool {
        // A check launching kernels ahead takes the MLX-ops version of any it reaches through
        // their public functions: no check runs, and nothing is recorded, while it does.
        if !check.backends.contains(&backend) || LAUNCH_ONLY.get() {
            return false;
        }
        let key = (check.name, backend);
        {
            let mut states = self.lock();
            match states.entry(key) {
                Entry::Occupied(state) if !afresh || *state.get() == Status::Checking => return *state.get() == Status::Verified,
                Entry::Occupied(mut state) => {
                    state.insert(Status::Checking);
                }
                Entry::Vacant(state) => {
                    state.insert(Status::Checking);
                }
            }
        }
        if !afresh && self.memo().is_some_and(|m| m.holds(check.name, backend)) {
            self.lock().insert(key, Status::Verified);
            return true;
        }
        // Not under the lock: a check may launch other kernels, whose first use checks them.
        // On this thread's own stream: the first use may come while a decode step is being
        // built for the evaluator thread (engine::encoder).
        let status = match crate::engine::encoder::own_stream(|| std::panic::catch_unwind(check.run)) {
            Ok(Ok(())) => Status::Verified,
            Ok(Err(reason)) => Status::Disabled(reason),
            Err(panic) => Status::Disabled(format!("its check panicked: {}", crate::engine::contain::panic_message(panic.as_ref()).unwrap_or_default())),
        };
        if let Status::Disabled(reason) = &status {
            (self.warn)(&format!(
                "kernel `{}` failed its self-check on {} ({reason}); switched off for this process, its MLX-ops version runs instead",
                check.name,
                backend.name()
            ));
        }
        let verified = status == Status::Verified;
        if verified {
            if let Some(memo) = self.memo() {
                memo.record(check.name, backend);
            }
        }
        self.lock().insert(key, status);
        verified
    }

    /// [`compile_ahead`] on `backend`: every check in `checks` when `afresh`, else those not yet
    /// settled in this process nor passed before in the memo. Returns how many were launched.
    pub fn compile_ahead(&self, checks: &[&KernelCheck], backend: Backend, afresh: bool, progress: impl FnMut(usize, usize)) -> usize {
        if backend != Backend::Cuda {
            // Only CUDA kernels go through the module cache's pool.
            return 0;
        }
        let due: Vec<&KernelCheck> = checks
            .iter()
            .copied()
            .filter(|c| c.backends.contains(&backend))
            .filter(|c| afresh || (!self.lock().contains_key(&(c.name, backend)) && !self.memo().is_some_and(|m| m.holds(c.name, backend))))
            .collect();
        LAUNCH_ONLY.set(true);
        for check in &due {
            // What a launch-only run returns or raises says nothing: its real run will say it.
            let _ = crate::engine::encoder::own_stream(|| std::panic::catch_unwind(check.run));
        }
        LAUNCH_ONLY.set(false);
        super::module_cache::settle_reporting(progress);
        due.len()
    }

    /// Where `check`'s kernel stands on `backend` (nothing is run).
    pub fn status(&self, check: &KernelCheck, backend: Backend) -> Status {
        if !check.backends.contains(&backend) {
            return Status::NotUsed;
        }
        self.lock().get(&(check.name, backend)).cloned().unwrap_or(Status::Unchecked)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(&'static str, Backend), Status>> {
        // A panic elsewhere while holding it leaves the map whole (each update is one insert).
        self.states.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn print_warning(message: &str) {
    eprintln!("warning: {message}");
}

static PROCESS: Registry = Registry { states: Mutex::new(BTreeMap::new()), warn: print_warning, memory: Memory::ThisMachine };

/// Whether `check`'s kernel may run on the current backend ([`backend`]): never on the CPU, and
/// on a GPU once it has passed its check, run at the first call.
pub fn enabled(check: &KernelCheck) -> bool {
    PROCESS.enabled(check, backend())
}

/// Runs `check` afresh on the current backend (not trusting the memo) and says whether its kernel
/// may run: `sala doctor`.
pub fn recheck(check: &KernelCheck) -> bool {
    PROCESS.recheck(check, backend())
}

/// Where `check`'s kernel stands on the current backend in this process.
pub fn status(check: &KernelCheck) -> Status {
    PROCESS.status(check, backend())
}

thread_local! {
    /// Set while [`compile_ahead`] runs checks to launch their kernels only.
    static LAUNCH_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Compiles the kernels of the checks this process will run (all of `checks` when `afresh`, as
/// `sala doctor` runs them) side by side before any runs: each check is run once launching its
/// kernels without evaluating or comparing anything, which queues their compiles on the module
/// cache's pool, and this waits for the pool, calling `progress(done, total)`. Nothing is
/// decided: each check still runs in full at its kernel's first use. Only CUDA compiles this way;
/// elsewhere it does nothing. Returns how many checks it launched.
pub fn compile_ahead(checks: &[&KernelCheck], afresh: bool, progress: impl FnMut(usize, usize)) -> usize {
    PROCESS.compile_ahead(checks, backend(), afresh, progress)
}

/// Makes the inputs, runs `oracle` (the kernel's MLX-ops version) and `kernel` on them, evaluates
/// each, and compares their outputs pairwise: the same shapes, integer outputs and infinities
/// equal, float outputs within [`TOLERANCE`]. The oracle may compute in a wider dtype than the
/// kernel's output. (On the CPU a check thus runs all but the kernel: tests/kernels.rs.)
pub fn verify<I>(
    inputs: impl FnOnce() -> Result<I>,
    kernel: impl FnOnce(&I) -> Result<Vec<Array>>,
    oracle: impl FnOnce(&I) -> Result<Vec<Array>>,
) -> Verdict {
    let inputs = inputs().map_err(|e| format!("its input could not be made: {}", one_line(e.what())))?;
    let kernel_failed = |e: mlx_rs::error::Exception| format!("the kernel failed: {}", one_line(e.what()));
    if LAUNCH_ONLY.get() {
        // compile_ahead: launching queues the kernels' compiles; the arrays are dropped unevaluated.
        kernel(&inputs).map_err(kernel_failed)?;
        return Ok(());
    }
    let want = evaluated(oracle(&inputs)).map_err(|e| format!("its MLX-ops version failed: {}", one_line(e.what())))?;
    let got = evaluated(kernel(&inputs)).map_err(kernel_failed)?;
    if got.len() != want.len() {
        return Err(format!("{} outputs where its MLX-ops version gives {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        agree(g, w).map_err(|e| format!("output {} of {}: {e}", i + 1, got.len()))?;
    }
    Ok(())
}

fn evaluated(outputs: Result<Vec<Array>>) -> Result<Vec<Array>> {
    let outputs = outputs?;
    super::module_cache::settle();
    mlx_rs::transforms::eval(&outputs)?;
    Ok(outputs)
}

fn agree(got: &Array, want: &Array) -> Verdict {
    if got.shape() != want.shape() {
        return Err(format!("shape {:?} where its MLX-ops version gives {:?}", got.shape(), want.shape()));
    }
    let host = |a: &Array| to_vec_f32(a).map_err(|e| one_line(e.what()));
    let (g, w) = (host(got)?, host(want)?);
    let exact = !matches!(want.dtype(), Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64);
    let (mut diff, mut norm) = (0f64, 0f64);
    for (i, (&x, &y)) in g.iter().zip(&w).enumerate() {
        if exact || !x.is_finite() || !y.is_finite() {
            // NaN equals nothing, so a NaN on either side fails.
            if x != y {
                return Err(format!("element {i} is {x} where its MLX-ops version gives {y}"));
            }
            continue;
        }
        diff += (x as f64 - y as f64).powi(2);
        norm += (y as f64).powi(2);
    }
    let error = if diff == 0.0 { 0.0 } else { (diff / norm).sqrt() };
    if error <= TOLERANCE {
        Ok(())
    } else {
        Err(format!("relative error {error:.2e}, tolerance {TOLERANCE:.0e}"))
    }
}

/// MLX's message (a compiler's log can run to many lines) as one line of at most 300 characters.
fn one_line(text: &str) -> String {
    let joined = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ");
    match joined.char_indices().nth(300) {
        Some((end, _)) => format!("{}…", &joined[..end]),
        None => joined,
    }
}

/// A check's input: `shape` filled with numbers in [−1, 1) drawn from `seed` on the host (the same
/// input on every device), as `dtype`, evaluated.
pub fn sample(shape: &[i32], seed: u64, dtype: Dtype) -> Result<Array> {
    sample_with(shape, seed, dtype, |rng| rng.random_range(-1.0..1.0))
}

/// [`sample`] of multiples of 1/4 in [−1, 1]: products of these, and sums of a few hundred, are
/// exact in every format a GPU multiplies in (bfloat16, TF32, float32 accumulation), so the scores
/// a kernel and its oracle rank come out in the same order.
pub fn sample_quarters(shape: &[i32], seed: u64, dtype: Dtype) -> Result<Array> {
    sample_with(shape, seed, dtype, |rng| rng.random_range(-4..=4) as f32 / 4.0)
}

fn sample_with(shape: &[i32], seed: u64, dtype: Dtype, mut draw: impl FnMut(&mut rand::rngs::StdRng) -> f32) -> Result<Array> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: i32 = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| draw(&mut rng)).collect();
    let a = Array::from_slice(&values, shape).as_dtype(dtype)?;
    a.eval()?;
    Ok(a)
}
