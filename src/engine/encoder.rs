//! Decode steps handed to MLX on a thread of their own. A GPU decode step costs the host two
//! things of about the same size: building its graph (our code and MLX's graph construction),
//! then encoding it (MLX's evaluation, which makes every operation a node of a CUDA graph). Done
//! one after the other they took longer than the GPU's step; here the evaluator thread encodes
//! step n while the builder makes step n+1 (eval/results/kernel-notes.md).
//!
//! MLX binds a stream to the thread that made it, unless it is made "thread-unsafe": such a
//! stream may be evaluated from any thread, and MLX does no locking for it. So:
//! - a step is built on the builder's shared stream ([`Encoder::build`]), and only the evaluator
//!   evaluates it ([`Encoder::queue`]);
//! - the builder evaluates nothing on the shared stream while the evaluator may be working on it:
//!   values it needs come through the evaluator ([`Encoder::read_i32`]), and the evaluations a
//!   build may make on first use (constants, kernel self-checks) go through [`own_stream`], which
//!   waits for the evaluator and runs them on the thread's own stream;
//! - the first step of a run is built and queued on this thread, on its own stream
//!   ([`Encoder::starting`]): it evaluates what the steps read that earlier work left lazy there
//!   (weights cast at load, a cache just rolled back), which the evaluator could not encode.
//!
//! On Metal (not tested there) and with `SALA_ENCODER=off` the same interface encodes on the
//! calling thread, as before.

use super::step_profile::{self, timed, Part};
use mlx_rs::{error::Exception, Array};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Result<T> = std::result::Result<T, Exception>;

/// Steps the builder may be ahead of the evaluator: each queued step holds its graph.
const QUEUE_DEPTH: usize = 2;

/// A job for the evaluator, with the run it belongs to: after a failure the rest of its run is
/// skipped (it depends on what failed), and the next run starts afresh.
struct Job {
    run: u64,
    work: Work,
}

enum Work {
    /// Queue these arrays' computation on the device (`async_eval`).
    Eval(Vec<Array>),
    /// Evaluate this integer array and send its values back.
    Read(Array, SyncSender<Result<Vec<i32>>>),
}

/// How far the evaluator got: jobs done, and the first failure not yet reported.
#[derive(Default)]
struct Progress {
    state: Mutex<(u64, Option<String>)>,
    changed: Condvar,
}

/// A stream that any thread may evaluate (MLX's thread-unsafe stream), on one device type.
struct SharedStream {
    stream: mlx_sys::mlx_stream,
    device_type: mlx_sys::mlx_device_type,
}

// The stream handle is a plain value (an index and a device) that MLX never changes.
unsafe impl Send for SharedStream {}

/// One builder thread's evaluator thread and shared stream, made on first use.
struct Evaluator {
    jobs: Option<SyncSender<Job>>,
    progress: Arc<Progress>,
    sent: Cell<u64>,
    /// Ends, and a new one starts, each time a failure is reported.
    run: Cell<u64>,
    shared: SharedStream,
    thread: Option<JoinHandle<()>>,
}

thread_local! {
    static EVALUATOR: RefCell<Option<Rc<Evaluator>>> = const { RefCell::new(None) };
    /// Set while [`Encoder::build`] runs: the thread's own default stream, to return to.
    static BUILDING: Cell<Option<mlx_sys::mlx_stream>> = const { Cell::new(None) };
}

/// Set by [`keep_on_calling_thread`].
static CALLING_THREAD_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps every later step of this process on the thread that builds it. For MLX's ring
/// collectives, which run on the building thread's CPU stream: with the model on a GPU that is not
/// the stream a build swaps for the shared one, and the evaluator could not encode it.
pub fn keep_on_calling_thread() {
    CALLING_THREAD_ONLY.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether steps are encoded on the evaluator thread: on the CPU and CUDA, unless
/// `SALA_ENCODER=off` (for A/B measurements) or [`keep_on_calling_thread`].
fn enabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("SALA_ENCODER").is_ok_and(|v| v == "off" || v == "0"))
        || CALLING_THREAD_ONLY.load(std::sync::atomic::Ordering::Relaxed);
    !off && (super::device::on_cpu() || super::device::gpu_backend() == Some("cuda"))
}

fn error(message: impl Into<String>) -> Exception {
    Exception::custom(message.into())
}

fn default_device_type() -> Option<mlx_sys::mlx_device_type> {
    mlx_rs::Device::try_default().and_then(|d| d.get_type()).ok().map(Into::into)
}

/// The calling thread's default stream on the default device.
fn default_stream() -> mlx_sys::mlx_stream {
    unsafe {
        let mut device = mlx_sys::mlx_device_new();
        mlx_sys::mlx_get_default_device(&mut device);
        let mut stream = mlx_sys::mlx_stream_new();
        mlx_sys::mlx_get_default_stream(&mut stream, device);
        mlx_sys::mlx_device_free(device);
        stream
    }
}

impl Evaluator {
    /// This thread's evaluator for the default device (started on first use), or None where
    /// steps are built and encoded on this thread.
    fn for_this_thread() -> Option<Rc<Evaluator>> {
        if !enabled() {
            return None;
        }
        let kind = default_device_type()?;
        EVALUATOR.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.as_ref().is_some_and(|e| e.shared.device_type != kind) {
                *slot = None;
            }
            if slot.is_none() {
                *slot = Evaluator::start(kind).map(Rc::new);
            }
            slot.clone()
        })
    }

    fn start(device_type: mlx_sys::mlx_device_type) -> Option<Evaluator> {
        // MLX sets up its device resources (event pool, library handles) at its first evaluation
        // and tears them down at exit in the reverse order of their making; a shared stream made
        // before them outlived them, and the process aborted at exit (a CUDA test binary whose
        // first GPU work was this).
        mlx_rs::transforms::eval([&Array::from_int(0)]).ok()?;
        let stream = unsafe {
            let device = mlx_sys::mlx_device_new_type(device_type, 0);
            let stream = mlx_sys::mlx_stream_new_thread_unsafe(device);
            mlx_sys::mlx_device_free(device);
            stream
        };
        if stream.ctx.is_null() {
            return None;
        }
        let (jobs, received) = sync_channel(QUEUE_DEPTH);
        let progress = Arc::new(Progress::default());
        let theirs = progress.clone();
        // The evaluator's own handle on the stream: it waits for the stream's work before it
        // ends, on its own thread.
        let stream_copy = unsafe {
            let mut copy = mlx_sys::mlx_stream_new();
            mlx_sys::mlx_stream_set(&mut copy, stream);
            SharedStream { stream: copy, device_type }
        };
        let thread = std::thread::Builder::new()
            .name("sala-encoder".into())
            .spawn(move || {
                evaluate(received, &theirs);
                let stream = stream_copy;
                unsafe {
                    mlx_sys::mlx_synchronize(stream.stream);
                    mlx_sys::mlx_stream_free(stream.stream);
                }
            })
            .ok()?;
        Some(Evaluator { jobs: Some(jobs), progress, sent: Cell::new(0), run: Cell::new(0), shared: SharedStream { stream, device_type }, thread: Some(thread) })
    }

    /// Waits until every job sent is done, whatever failed; the progress, still locked.
    fn idle(&self) -> std::sync::MutexGuard<'_, (u64, Option<String>)> {
        let sent = self.sent.get();
        let mut state = self.progress.state.lock().expect("encoder progress lock");
        while state.0 < sent {
            state = self.progress.changed.wait(state).expect("encoder progress lock");
        }
        state
    }

    /// Waits until every job sent is done, then reports a failure once.
    fn wait(&self) -> Result<()> {
        let mut idle = timed(Part::Blocked, || self.idle());
        self.report(&mut idle.1)
    }

    /// A failure not yet reported, as an error; the run it ended is over.
    fn report(&self, failure: &mut Option<String>) -> Result<()> {
        match failure.take() {
            Some(message) => {
                self.run.set(self.run.get() + 1);
                Err(error(message))
            }
            None => Ok(()),
        }
    }

    fn send(&self, work: Work) -> Result<()> {
        self.report(&mut self.progress.state.lock().expect("encoder progress lock").1)?;
        let jobs = self.jobs.as_ref().expect("the job channel lives as long as the evaluator");
        timed(Part::Blocked, || jobs.send(Job { run: self.run.get(), work })).map_err(|_| error("the decode evaluator thread stopped"))?;
        self.sent.set(self.sent.get() + 1);
        Ok(())
    }
}

/// Where a run of decode steps is encoded: on this thread's evaluator (CPU, CUDA), or on this
/// thread itself (Metal, `SALA_ENCODER=off`), behind one interface.
pub struct Encoder {
    evaluator: Option<Rc<Evaluator>>,
    /// The next step is built and queued on this thread ([`Encoder::starting`]).
    here: Cell<bool>,
}

impl Encoder {
    /// The encoder for this thread and the default device.
    pub fn for_this_thread() -> Encoder {
        Encoder { evaluator: Evaluator::for_this_thread(), here: Cell::new(false) }
    }

    /// For a run's first step: once the evaluator is idle, that step is built and queued on this
    /// thread, on its own stream; the steps after it go to the evaluator.
    pub fn starting(self) -> Result<Encoder> {
        self.wait()?;
        self.here.set(true);
        Ok(self)
    }

    /// Whether steps go to the evaluator thread.
    pub fn is_threaded(&self) -> bool {
        self.evaluator.is_some()
    }

    /// Runs `build` with the shared stream as this thread's default, so the graph it makes can be
    /// queued. Nested calls keep the outer one's stream.
    pub fn build<T>(&self, build: impl FnOnce() -> T) -> T {
        struct Restore(Option<mlx_sys::mlx_stream>);
        impl Drop for Restore {
            fn drop(&mut self) {
                if let Some(own) = self.0.take() {
                    BUILDING.with(|b| b.set(None));
                    unsafe {
                        mlx_sys::mlx_set_default_stream(own);
                        mlx_sys::mlx_stream_free(own);
                    }
                }
            }
        }
        let Some(evaluator) = self.evaluator.as_ref().filter(|_| !self.here.get()) else {
            return timed(Part::Build, build);
        };
        let restore = if BUILDING.with(|b| b.get()).is_some() {
            Restore(None)
        } else {
            let own = default_stream();
            BUILDING.with(|b| b.set(Some(own)));
            unsafe { mlx_sys::mlx_set_default_stream(evaluator.shared.stream) };
            Restore(Some(own))
        };
        let result = timed(Part::Build, build);
        drop(restore);
        result
    }

    /// Queues the computation of `arrays` (a step's outputs and the caches it leaves) on the
    /// device, through the evaluator, which may be [`QUEUE_DEPTH`] steps behind before this waits.
    pub fn queue(&self, arrays: Vec<Array>) -> Result<()> {
        match self.evaluator.as_ref().filter(|_| !self.here.replace(false)) {
            Some(evaluator) => evaluator.send(Work::Eval(arrays)),
            None => step_profile::encode(&arrays),
        }
    }

    /// The values of the integer array `a`, evaluated after every step queued before it.
    pub fn read_i32(&self, a: &Array) -> Result<Vec<i32>> {
        self.request_i32(a)?.wait()
    }

    /// [`Encoder::read_i32`] asked for now and taken later: the evaluator reads `a` before it
    /// encodes what is queued after this, so a value computed already comes back without waiting
    /// for the next step's encoding (which the builder would otherwise sit through).
    pub fn request_i32(&self, a: &Array) -> Result<PendingRead> {
        let Some(evaluator) = &self.evaluator else {
            return Ok(PendingRead::Here(a.clone()));
        };
        let (reply, answer) = sync_channel(1);
        evaluator.send(Work::Read(a.clone(), reply))?;
        Ok(PendingRead::Queued(answer))
    }

    /// Waits until everything queued is on the device's queue; the first error met doing it.
    /// After it this thread may evaluate anything again.
    pub fn wait(&self) -> Result<()> {
        match &self.evaluator {
            Some(evaluator) => evaluator.wait(),
            None => Ok(()),
        }
    }
}

/// A read asked of the evaluator ([`Encoder::request_i32`]).
pub enum PendingRead {
    Queued(Receiver<Result<Vec<i32>>>),
    /// No evaluator: read on this thread when waited for.
    Here(Array),
}

impl PendingRead {
    pub fn wait(self) -> Result<Vec<i32>> {
        match self {
            PendingRead::Queued(answer) => timed(Part::Blocked, || answer.recv()).map_err(|_| error("the decode evaluator thread stopped"))?,
            PendingRead::Here(a) => timed(Part::Blocked, || crate::engine::ops::to_vec_i32(&a)),
        }
    }
}

impl Drop for Evaluator {
    /// Runs as the builder thread ends, when MLX's own per-thread state may already be gone:
    /// nothing here calls into MLX beyond freeing a handle (the evaluator thread waits for the
    /// stream's work before it ends).
    fn drop(&mut self) {
        // Closing the channel ends the evaluator once it has done what it holds.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        unsafe {
            mlx_sys::mlx_stream_free(self.shared.stream);
        }
    }
}

/// The evaluator thread: does the jobs in order, skipping the rest of a run after a failure. A
/// read is queued like a step and answered once the device has computed its array, while the
/// steps sent after it go on being encoded: waiting for the device here would leave the next step
/// unencoded while the device runs out of work.
fn evaluate(jobs: Receiver<Job>, progress: &Progress) {
    use std::sync::mpsc::RecvTimeoutError;
    // How long the thread sleeps between looks at the reads it holds when no job comes.
    const POLL: std::time::Duration = std::time::Duration::from_micros(20);
    #[cfg(target_os = "linux")]
    unsafe {
        // Wake from those sleeps on time rather than up to the default 50 µs late.
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
    step_profile::on_evaluator_thread();
    let mut failed_run = None;
    let mut reads: Vec<PendingValue> = Vec::new();
    loop {
        let job = if reads.is_empty() {
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => break,
            }
        } else {
            answer_available(&mut reads, progress, &mut failed_run);
            if reads.is_empty() {
                continue;
            }
            match timed(Part::DeviceWait, || jobs.recv_timeout(POLL)) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    for read in reads.drain(..) {
                        let outcome = read.answer();
                        done(progress, read.run, outcome, &mut failed_run);
                    }
                    break;
                }
            }
        };
        let Job { run, work } = job;
        let skipped = failed_run == Some(run);
        match work {
            Work::Eval(_) if skipped => done(progress, run, Ok(()), &mut failed_run),
            Work::Eval(arrays) => {
                let outcome = step_profile::encode(&arrays).map_err(|e| e.to_string());
                done(progress, run, outcome, &mut failed_run);
            }
            Work::Read(_, reply) if skipped => {
                let _ = reply.send(Err(error("an earlier decode step failed")));
                done(progress, run, Ok(()), &mut failed_run);
            }
            Work::Read(a, reply) => match queue_read(&a) {
                Ok(flat) => reads.push(PendingValue { run, flat, reply }),
                Err(e) => {
                    let message = e.to_string();
                    let _ = reply.send(Err(e));
                    done(progress, run, Err(message), &mut failed_run);
                }
            },
        }
    }
}

/// A read whose array is queued on the device, waiting to be computed.
struct PendingValue {
    run: u64,
    flat: Array,
    reply: SyncSender<Result<Vec<i32>>>,
}

impl PendingValue {
    /// Sends the values back (waiting for them if need be); the failure to report, if any.
    fn answer(&self) -> std::result::Result<(), String> {
        let values = timed(Part::DeviceWait, || self.flat.try_as_slice::<i32>().map(<[i32]>::to_vec).map_err(|e| error(e.to_string())));
        let outcome = values.as_ref().map(|_| ()).map_err(|e| e.to_string());
        let _ = self.reply.send(values);
        outcome
    }
}

/// `a` as a flat int32 array, queued for the device behind everything queued before it.
fn queue_read(a: &Array) -> Result<Array> {
    let flat = a.as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[-1])?;
    step_profile::encode([&flat])?;
    Ok(flat)
}

/// Answers the reads whose arrays the device has computed.
fn answer_available(reads: &mut Vec<PendingValue>, progress: &Progress, failed_run: &mut Option<u64>) {
    reads.retain(|read| {
        let mut available = false;
        unsafe { mlx_sys::_mlx_array_is_available(&mut available, read.flat.as_ptr()) };
        if available {
            let outcome = read.answer();
            done(progress, read.run, outcome, failed_run);
        }
        !available
    });
}

/// Marks a job done, keeping the first failure of its run for the builder.
fn done(progress: &Progress, run: u64, outcome: std::result::Result<(), String>, failed_run: &mut Option<u64>) {
    let mut state = progress.state.lock().expect("encoder progress lock");
    state.0 += 1;
    if let Err(e) = outcome {
        *failed_run = Some(run);
        state.1.get_or_insert(e);
    }
    progress.changed.notify_all();
}

/// Runs `f` on the calling thread's own stream: an evaluation made while a step is being built
/// on the shared stream (a constant made on first use, a kernel's self-check). Waits first for
/// the evaluator, so nothing else uses the device's streams from this side meanwhile. Outside
/// [`Encoder::build`] it just runs `f`.
pub fn own_stream<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the shared stream back as the default when `f` is done, however it ends.
    struct Back {
        shared: mlx_sys::mlx_stream,
        own: mlx_sys::mlx_stream,
    }
    impl Drop for Back {
        fn drop(&mut self) {
            unsafe {
                mlx_sys::mlx_set_default_stream(self.shared);
                mlx_sys::mlx_stream_free(self.shared);
            }
            BUILDING.with(|b| b.set(Some(self.own)));
        }
    }
    let Some(own) = BUILDING.with(|b| b.get()) else {
        return f();
    };
    if let Some(evaluator) = EVALUATOR.with(|slot| slot.borrow().clone()) {
        // Only to be idle: a failure stays for the next queue or wait to report.
        drop(evaluator.idle());
    }
    let back = Back { shared: default_stream(), own };
    BUILDING.with(|b| b.set(None));
    unsafe { mlx_sys::mlx_set_default_stream(own) };
    let result = f();
    drop(back);
    result
}

/// Whether this thread is inside [`Encoder::build`] for the evaluator thread (so it must not
/// evaluate on the shared stream itself).
pub fn building_for_evaluator() -> bool {
    BUILDING.with(|b| b.get()).is_some()
}

/// Waits for this thread's evaluator, if it has one (before the process exits).
pub fn drain() {
    if let Some(evaluator) = EVALUATOR.with(|slot| slot.borrow().clone()) {
        let _ = evaluator.wait();
        unsafe {
            mlx_sys::mlx_synchronize(evaluator.shared.stream);
        }
    }
}
