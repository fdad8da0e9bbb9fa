//! Where the host's time goes while decoding, summed over the process so `sala bench --profile`
//! can report it per step: building graphs (the builder thread), encoding them for the device
//! (the evaluator thread, `engine::encoder`), the builder blocked (on the evaluator, or on the
//! device where it evaluates itself), and the evaluator blocked on the device for a value read
//! back. With the wall time beside them they
//! say what bounds decode: a builder never blocked is the limit itself, an evaluator encoding
//! the whole step is, and otherwise the device is. Counting a graph's operations (MLX's printed
//! graph, one line per operation) is slow, so it is done only while asked ([`count_ops`]).

use mlx_rs::{error::Exception, Array};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The host's time in nanoseconds, and the operations counted, since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTimes {
    /// Building graphs on the builder thread.
    pub build_ns: u64,
    /// Encoding graphs for the device (`async_eval`), on whichever thread does it.
    pub encode_ns: u64,
    /// The part of `encode_ns` done on threads other than the evaluator (where there is none,
    /// or on the host-drawing paths).
    pub builder_encode_ns: u64,
    /// The builder waiting: for the evaluator (a full queue, a read, an idle wait), or for the
    /// device on the paths that evaluate on its thread.
    pub blocked_ns: u64,
    /// The evaluator waiting for the device to compute what a read needs.
    pub device_wait_ns: u64,
    /// Operations in the graphs encoded while counting was on.
    pub ops: u64,
}

impl HostTimes {
    /// `f` of each field of the two.
    fn combine(self, other: HostTimes, f: fn(u64, u64) -> u64) -> HostTimes {
        HostTimes {
            build_ns: f(self.build_ns, other.build_ns),
            encode_ns: f(self.encode_ns, other.encode_ns),
            builder_encode_ns: f(self.builder_encode_ns, other.builder_encode_ns),
            blocked_ns: f(self.blocked_ns, other.blocked_ns),
            device_wait_ns: f(self.device_wait_ns, other.device_wait_ns),
            ops: f(self.ops, other.ops),
        }
    }
}

impl std::ops::Add for HostTimes {
    type Output = HostTimes;
    fn add(self, other: HostTimes) -> HostTimes {
        self.combine(other, |a, b| a + b)
    }
}

impl std::ops::Sub for HostTimes {
    type Output = HostTimes;
    fn sub(self, before: HostTimes) -> HostTimes {
        self.combine(before, |a, b| a - b)
    }
}

/// What a timed stretch of host work was.
#[derive(Debug, Clone, Copy)]
pub enum Part {
    Build,
    Encode,
    Blocked,
    DeviceWait,
}

static NANOS: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static BUILDER_ENCODE: AtomicU64 = AtomicU64::new(0);
static OPS: AtomicU64 = AtomicU64::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Build calls nest (a step's draw inside its forward): only the outermost is timed.
    static BUILDING: Cell<bool> = const { Cell::new(false) };
    /// Set on the evaluator thread (`engine::encoder`).
    static EVALUATOR: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the evaluator: its encoding is not the builder's.
pub fn on_evaluator_thread() {
    EVALUATOR.with(|e| e.set(true));
}

/// Runs `f`, adding its time to `part`.
pub fn timed<T>(part: Part, f: impl FnOnce() -> T) -> T {
    if matches!(part, Part::Build) && BUILDING.with(|b| b.replace(true)) {
        return f();
    }
    let start = Instant::now();
    let result = f();
    let spent = start.elapsed().as_nanos() as u64;
    NANOS[part as usize].fetch_add(spent, Relaxed);
    if matches!(part, Part::Encode) && !EVALUATOR.with(Cell::get) {
        BUILDER_ENCODE.fetch_add(spent, Relaxed);
    }
    if matches!(part, Part::Build) {
        BUILDING.with(|b| b.set(false));
    }
    result
}

/// The totals so far; a stretch of work is the difference of two.
pub fn totals() -> HostTimes {
    let at = |p: Part| NANOS[p as usize].load(Relaxed);
    HostTimes {
        build_ns: at(Part::Build),
        encode_ns: at(Part::Encode),
        builder_encode_ns: BUILDER_ENCODE.load(Relaxed),
        blocked_ns: at(Part::Blocked),
        device_wait_ns: at(Part::DeviceWait),
        ops: OPS.load(Relaxed),
    }
}

/// Counts the operations of every graph encoded from now until called with `false`.
pub fn count_ops(on: bool) {
    COUNTING.store(on, Relaxed);
}

/// Queues `arrays`' computation on the device (`async_eval`), timed as encoding, their graph's
/// operations counted first when asked.
pub fn encode<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<(), Exception> {
    let arrays: Vec<&Array> = arrays.into_iter().collect();
    if COUNTING.load(Relaxed) {
        OPS.fetch_add(graph_operations(&arrays), Relaxed);
    }
    timed(Part::Encode, || mlx_rs::transforms::async_eval(arrays))
}

/// The operations not yet evaluated behind `arrays`: the lines of MLX's printed graph, less its
/// "Inputs:" and "Outputs:" lines.
fn graph_operations(arrays: &[&Array]) -> u64 {
    let mut buffer: *mut libc::c_char = std::ptr::null_mut();
    let mut size: libc::size_t = 0;
    unsafe {
        let file = libc::open_memstream(&mut buffer, &mut size);
        if file.is_null() {
            return 0;
        }
        let outputs = mlx_sys::mlx_vector_array_new();
        for a in arrays {
            mlx_sys::mlx_vector_array_append_value(outputs, a.as_ptr());
        }
        let namer = mlx_sys::mlx_node_namer_new();
        mlx_sys::mlx_print_graph(file.cast(), namer, outputs);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(outputs);
        libc::fclose(file);
        let text = std::slice::from_raw_parts(buffer as *const u8, size);
        let lines = text.split(|&b| b == b'\n').filter(|l| !l.is_empty() && !l.starts_with(b"Inputs:") && !l.starts_with(b"Outputs:")).count();
        libc::free(buffer.cast());
        lines as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_operations_of_an_unevaluated_graph_and_times_its_encoding() {
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
        let b = a.multiply(&a).unwrap().add(&a).unwrap().exp().unwrap();
        assert_eq!(graph_operations(&[&b]), 3);
        mlx_rs::transforms::eval([&b]).unwrap();
        // Evaluated: nothing is left to encode.
        assert_eq!(graph_operations(&[&b]), 0);
        let before = totals();
        let c = b.sqrt().unwrap();
        count_ops(true);
        encode([&c]).unwrap();
        count_ops(false);
        let d = c.sqrt().unwrap();
        encode([&d]).unwrap();
        let spent = totals() - before;
        // Other tests encode in parallel: at least this test's one counted operation.
        assert!(spent.ops >= 1 && spent.encode_ns > 0, "{spent:?}");
        mlx_rs::transforms::eval([&d]).unwrap();
        assert!((d.as_slice::<f32>()[1] - 6f32.exp().sqrt().sqrt()).abs() < 1e-3);
    }
}
