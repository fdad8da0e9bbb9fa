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
    super::device::await_kernel_compiles();
    if COUNTING.load(Relaxed) {
        OPS.fetch_add(graph_operations(&arrays), Relaxed);
    }
    timed(Part::Encode, || mlx_rs::transforms::async_eval(arrays))
}

/// A mark on the device's timeline once an array is computed: the GPU's clock in nanoseconds
/// (`[1]` uint64), or `None` where the backend has no clock to read. The engine cannot name the
/// kernel that does it (`kernels::stamp`, above it), so it is handed over at load.
pub type StampKernel = fn(&Array) -> Result<Option<Array>, Exception>;

static STAMP_KERNEL: std::sync::OnceLock<StampKernel> = std::sync::OnceLock::new();
static TIMING_DEVICE: AtomicBool = AtomicBool::new(false);

/// Whether a mark opens a stretch of the device's work, opens its tail (a decode step's draw), or
/// closes it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mark {
    Start,
    Tail,
    End,
}

thread_local! {
    /// The marks asked for on this (builder) thread since [`device_times`] last took them.
    static MARKS: std::cell::RefCell<Vec<(Mark, Array)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes [`stretch_start`] and [`stretch_end`] mark through `kernel` (set once, at load).
pub fn use_stamp_kernel(kernel: StampKernel) {
    let _ = STAMP_KERNEL.set(kernel);
}

/// Marks the device's timeline around each stretch of decode work from now until called with
/// `false`. The first call compiles the stamp kernel for each type a stretch starts or ends on
/// (MLX compiles a kernel per input type), so that no compilation falls in a timed stretch: it
/// had cost a bench's first timed run seconds.
pub fn time_device(on: bool) -> Result<(), Exception> {
    static COMPILED: AtomicBool = AtomicBool::new(false);
    if on && !COMPILED.swap(true, Relaxed) {
        if let Some(kernel) = STAMP_KERNEL.get() {
            use mlx_rs::Dtype::*;
            for dtype in [Uint32, Int32, Bfloat16, Float16, Float32] {
                if let Some(stamp) = kernel(&Array::from_int(0).as_dtype(dtype)?)? {
                    stamp.eval()?;
                }
            }
        }
    }
    TIMING_DEVICE.store(on, Relaxed);
    Ok(())
}

fn mark(kind: Mark, after: &Array) -> Result<Option<Array>, Exception> {
    let Some(kernel) = STAMP_KERNEL.get().filter(|_| TIMING_DEVICE.load(Relaxed)) else { return Ok(None) };
    let stamp = kernel(after)?;
    if let Some(stamp) = &stamp {
        MARKS.with(|m| m.borrow_mut().push((kind, stamp.clone())));
    }
    Ok(stamp)
}

/// `input` of a stretch of device work (a decode step, a draw), made to wait for a mark of the
/// clock when the device is being timed, so the stretch's work starts after it.
pub fn stretch_start(input: &Array) -> Result<Array, Exception> {
    after_mark(Mark::Start, input)
}

/// `input` of a stretch's tail (a step's draw, after its forward), made to wait for a mark of the
/// clock when the device is being timed, so the tail's time is told apart from the rest.
pub fn stretch_tail(input: &Array) -> Result<Array, Exception> {
    after_mark(Mark::Tail, input)
}

/// `input`, made to wait for a mark of `kind` when the device is being timed.
fn after_mark(kind: Mark, input: &Array) -> Result<Array, Exception> {
    match mark(kind, input)? {
        Some(stamp) => super::ops::depends(input, &stamp),
        None => Ok(input.clone()),
    }
}

/// The mark closing a stretch whose last result is `last`, to evaluate with the stretch's other
/// outputs; `None` when the device is not being timed.
pub fn stretch_end(last: &Array) -> Result<Option<Array>, Exception> {
    mark(Mark::End, last)
}

/// The device's time over the stretches marked since the last call, from its own clock.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceTimes {
    /// From each stretch's start mark to its end mark, summed.
    pub busy_ns: u64,
    /// From each stretch's end mark to the next one's start mark, summed: the device idle, or
    /// running work outside the marked stretches.
    pub gaps_ns: u64,
    /// The part of `busy_ns` from each stretch's tail mark to its end mark (a step's draw).
    pub tail_ns: u64,
    pub stretches: usize,
    /// Stretches with a tail.
    pub tails: usize,
}

impl std::ops::Add for DeviceTimes {
    type Output = DeviceTimes;
    fn add(self, other: DeviceTimes) -> DeviceTimes {
        DeviceTimes {
            busy_ns: self.busy_ns + other.busy_ns,
            gaps_ns: self.gaps_ns + other.gaps_ns,
            tail_ns: self.tail_ns + other.tail_ns,
            stretches: self.stretches + other.stretches,
            tails: self.tails + other.tails,
        }
    }
}

/// Reads and forgets this thread's marks (every stretch marked must have been queued for the
/// device); `None` when none was marked.
pub fn device_times() -> Result<Option<DeviceTimes>, Exception> {
    let marks = MARKS.with(|m| std::mem::take(&mut *m.borrow_mut()));
    if marks.is_empty() {
        return Ok(None);
    }
    // One read for all of them.
    let stamps: Vec<&Array> = marks.iter().map(|(_, stamp)| stamp).collect();
    let clock = mlx_rs::ops::concatenate(&stamps, 0)?;
    clock.eval()?;
    let read: Vec<(Mark, u64)> = marks.iter().map(|(kind, _)| *kind).zip(clock.as_slice::<u64>().iter().copied()).collect();
    Ok(times_between(&read))
}

/// The busy stretches, their tails and the gaps between them of clock readings in the order they
/// were asked for; a start without its end (a step that failed) is dropped, with its tail.
fn times_between(marks: &[(Mark, u64)]) -> Option<DeviceTimes> {
    let mut times = DeviceTimes::default();
    let (mut open, mut tail, mut last_end): (Option<u64>, Option<u64>, Option<u64>) = (None, None, None);
    for &(kind, at) in marks {
        match kind {
            Mark::Start => (open, tail) = (Some(at), None),
            Mark::Tail => tail = open.map(|_| at),
            Mark::End => {
                if let Some(start) = open.take() {
                    times.busy_ns += at.saturating_sub(start);
                    if let Some(tail) = tail.take() {
                        times.tail_ns += at.saturating_sub(tail);
                        times.tails += 1;
                    }
                    if let Some(end) = last_end {
                        times.gaps_ns += start.saturating_sub(end);
                    }
                    times.stretches += 1;
                    last_end = Some(at);
                }
            }
        }
    }
    (times.stretches > 0).then_some(times)
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
        let outputs = crate::engine::ops::ArrayList::of(arrays);
        let namer = mlx_sys::mlx_node_namer_new();
        mlx_sys::mlx_print_graph(file.cast(), namer, outputs.as_ptr());
        mlx_sys::mlx_node_namer_free(namer);
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

    #[test]
    fn device_time_is_each_stretch_from_start_to_end_and_the_gaps_between() {
        use Mark::{End, Start, Tail};
        // Two steps, a failed one (no end) between them, then a third.
        let marks = [(Start, 100), (End, 160), (Start, 170), (Start, 200), (End, 250), (Start, 255), (End, 300)];
        let times = times_between(&marks).unwrap();
        assert_eq!(times, DeviceTimes { busy_ns: 60 + 50 + 45, gaps_ns: 40 + 5, stretches: 3, ..Default::default() });
        // Tails (a step's draw) inside their stretches; a failed step's tail goes with it.
        let marks = [(Start, 100), (Tail, 150), (End, 160), (Start, 170), (Tail, 180), (Start, 200), (End, 250), (Start, 255), (Tail, 290), (End, 300)];
        let times = times_between(&marks).unwrap();
        assert_eq!(times, DeviceTimes { busy_ns: 60 + 50 + 45, gaps_ns: 40 + 5, tail_ns: 10 + 10, stretches: 3, tails: 2 });
        assert_eq!(times_between(&[(Start, 5)]), None);
        assert_eq!(times_between(&[]), None);
    }

    #[test]
    fn marks_are_read_back_in_the_order_they_were_made() {
        use Mark::{End, Start};
        // As a stamp kernel leaves them: `[1]` uint64 readings, here made on the host.
        let readings = [(Start, 100u64), (End, 160), (Start, 170), (End, 200)];
        MARKS.with(|m| m.borrow_mut().extend(readings.map(|(kind, at)| (kind, Array::from_slice(&[at], &[1])))));
        assert_eq!(device_times().unwrap(), Some(DeviceTimes { busy_ns: 90, gaps_ns: 10, stretches: 2, ..Default::default() }));
        // Taken: a second read finds none.
        assert_eq!(device_times().unwrap(), None);
    }

    #[test]
    fn without_a_clock_a_stretch_is_its_input_and_nothing_is_marked() {
        // The CPU has no clock to read (and the library's tests install no stamp kernel).
        time_device(true).unwrap();
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]);
        let started = stretch_start(&x).unwrap();
        let tail = stretch_tail(&started).unwrap();
        let end = stretch_end(&tail).unwrap();
        time_device(false).unwrap();
        assert!(end.is_none());
        assert_eq!(started.as_slice::<f32>(), &[1.0, 2.0]);
        assert_eq!(tail.as_slice::<f32>(), &[1.0, 2.0]);
        assert_eq!(device_times().unwrap(), None);
    }
}
