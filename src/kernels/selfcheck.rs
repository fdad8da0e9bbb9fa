//! The kernels' self-check. Our kernels are compiled at run time, and the Metal twins had never run
//! when they were written, so none is trusted blindly: the first time a process would launch a
//! kernel on a GPU backend, it runs the kernel once on a small fixed input against its MLX-ops
//! version. A compile failure, any other error, or a result beyond [`TOLERANCE`] switches that
//! kernel off for the rest of the process, with one warning on stderr, and its callers take the
//! MLX-ops version (docs/adding-a-kernel.md, "The self-check"). `sala doctor` runs every check.
//!
//! Each kernel registers a [`KernelCheck`] beside its launch; its public function asks
//! [`enabled`] after its own shape checks, before it launches.

use super::custom::{backend, Backend};
use crate::engine::ops::to_vec_f32;
use mlx_rs::{error::Result, Array, Dtype};
use rand::{Rng, SeedableRng};
use std::collections::btree_map::{BTreeMap, Entry};
use std::sync::{Mutex, MutexGuard};

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

/// Each kernel's [`Status`] per backend, for one process (see [`enabled`]); its own instances serve
/// tests.
pub struct Registry {
    states: Mutex<BTreeMap<(&'static str, Backend), Status>>,
    warn: fn(&str),
}

impl Registry {
    /// A registry that reports each kernel it switches off through `warn`, once.
    pub const fn new(warn: fn(&str)) -> Self {
        Self { states: Mutex::new(BTreeMap::new()), warn }
    }

    /// Whether `check`'s kernel may run on `backend`. The first call for a kernel and backend runs
    /// its check; calls while it runs (another thread, or the check itself) answer no.
    pub fn enabled(&self, check: &KernelCheck, backend: Backend) -> bool {
        if !check.backends.contains(&backend) {
            return false;
        }
        let key = (check.name, backend);
        {
            let mut states = self.lock();
            match states.entry(key) {
                Entry::Occupied(state) => return *state.get() == Status::Verified,
                Entry::Vacant(state) => {
                    state.insert(Status::Checking);
                }
            }
        }
        // Not under the lock: a check may launch other kernels, whose first use checks them.
        let status = match std::panic::catch_unwind(check.run) {
            Ok(Ok(())) => Status::Verified,
            Ok(Err(reason)) => Status::Disabled(reason),
            Err(panic) => Status::Disabled(format!("its check panicked: {}", panic_text(panic.as_ref()))),
        };
        if let Status::Disabled(reason) = &status {
            (self.warn)(&format!(
                "kernel `{}` failed its self-check on {} ({reason}); switched off for this process, its MLX-ops version runs instead",
                check.name,
                backend.name()
            ));
        }
        let verified = status == Status::Verified;
        self.lock().insert(key, status);
        verified
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

static PROCESS: Registry = Registry::new(print_warning);

/// Whether `check`'s kernel may run on the current backend ([`backend`]): never on the CPU, and
/// on a GPU once it has passed its check, run at the first call.
pub fn enabled(check: &KernelCheck) -> bool {
    PROCESS.enabled(check, backend())
}

/// Where `check`'s kernel stands on the current backend in this process.
pub fn status(check: &KernelCheck) -> Status {
    PROCESS.status(check, backend())
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
    let want = evaluated(oracle(&inputs)).map_err(|e| format!("its MLX-ops version failed: {}", one_line(e.what())))?;
    let got = evaluated(kernel(&inputs)).map_err(|e| format!("the kernel failed: {}", one_line(e.what())))?;
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

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default()
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
