//! Starting a tensor-parallel run: `--tp N` makes the process a supervisor that starts N ranks,
//! copies of itself with the environment MLX's launcher (`mlx.launch`) sets, one per device, and
//! watches them; each rank joins MLX's distributed group and runs the command on its shard.
//! A process started with MLX_RANK already set (by our supervisor, by `mlx.launch`, or by hand on
//! several machines) is a rank and starts nothing. See docs/architecture.md, "Tensor parallelism".

use crate::engine::device::{self, DeviceKind};
use crate::engine::distributed::{Backend, TensorParallel};
use crate::engine::error::Error;
use mlx_rs::{ops, Array, Dtype};
use std::collections::VecDeque;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What this process does after [`start`].
pub enum Start {
    /// Run the command as this rank of the group (a group of one without `--tp`).
    Rank(TensorParallel),
    /// This process was the supervisor: every rank has ended; exit with this code.
    Finished(i32),
}

/// Set in each rank by the supervisor: its pid, so the rank stops when the supervisor is gone.
const SUPERVISOR_PID: &str = "SALA_TP_SUPERVISOR_PID";
/// A rank that has not reached the others by then gives up (ring's accept would wait forever).
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);
/// Lines of a follower's stderr kept to explain its failure.
const STDERR_LINES: usize = 20;
/// After SIGTERM, ranks still running are killed.
const KILL_AFTER: Duration = Duration::from_secs(5);
/// Followers still running this long after rank 0 finished are stopped as hung.
const FOLLOWERS_AFTER_LEADER: Duration = Duration::from_secs(30);
/// How long a rank's plain failure waits for a rank killed by a signal to be reaped: a killed
/// process closes its sockets before its parent can reap it, so its peer may exit of the lost
/// connection first, and would be taken for the cause.
const CAUSE_SETTLES: Duration = Duration::from_secs(2);

/// Starts `tp` ranks (this process supervises them and returns `Finished` when they end) or, when
/// this process is a rank, joins the group. `backend`: `None` picks nccl on a CUDA GPU, else ring;
/// `device`: the device the command runs on (`None`: the GPU when MLX has one).
pub fn start(tp: usize, backend: Option<Backend>, device: Option<DeviceKind>) -> anyhow::Result<Start> {
    if tp == 0 {
        return Err(Error::Usage("--tp 0: give the number of devices to split the model over (1 or more)".into()).into());
    }
    match std::env::var("MLX_RANK") {
        Ok(rank) => Ok(Start::Rank(join(tp, rank_backend(backend, device), &rank)?)),
        Err(_) if tp == 1 => Ok(Start::Rank(TensorParallel::single())),
        Err(_) => Ok(Start::Finished(supervise(tp, supervisor_backend(backend, device)?)?)),
    }
}

/// Whether the command runs on a CUDA GPU, asked without starting CUDA (MLX answers from how
/// it was built), so a supervisor leaves every GPU to its ranks.
fn on_cuda(device: Option<DeviceKind>) -> bool {
    device != Some(DeviceKind::Cpu) && device::gpu_backend() == Some("cuda")
}

fn default_backend(device: Option<DeviceKind>) -> Backend {
    if on_cuda(device) {
        Backend::Nccl
    } else {
        Backend::Ring
    }
}

/// A rank's backend: the one asked for, else the one whose environment its launcher set.
fn rank_backend(backend: Option<Backend>, device: Option<DeviceKind>) -> Backend {
    backend.unwrap_or_else(|| {
        if std::env::var_os("NCCL_HOST_IP").is_some() {
            Backend::Nccl
        } else if std::env::var_os("MLX_HOSTFILE").is_some() {
            Backend::Ring
        } else {
            default_backend(device)
        }
    })
}

fn supervisor_backend(backend: Option<Backend>, device: Option<DeviceKind>) -> anyhow::Result<Backend> {
    match backend {
        Some(Backend::Nccl) if device::gpu_backend() != Some("cuda") => Err(Error::Usage(
            "--tp-backend nccl: this MLX build has no NCCL (it comes with the CUDA build of MLX); use --tp-backend ring".into(),
        )
        .into()),
        Some(Backend::Nccl) if device == Some(DeviceKind::Cpu) => {
            Err(Error::Usage("--tp-backend nccl runs on CUDA GPUs, not with --device cpu: use --tp-backend ring".into()).into())
        }
        Some(backend) => Ok(backend),
        None => Ok(default_backend(device)),
    }
}

/// Joins the group as the rank MLX_RANK names, giving up after [`JOIN_TIMEOUT`].
fn join(tp: usize, backend: Backend, rank: &str) -> anyhow::Result<TensorParallel> {
    let rank: usize = rank.trim().parse().map_err(|_| Error::Usage(format!("MLX_RANK={rank:?} is not a rank number (0, 1, …)")))?;
    if backend == Backend::Nccl && std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // NVLink multicast stays off on ranks started by any launcher, not only ours: on shared
        // hosts it can take the GPUs out of service. Set before NCCL starts, with no other thread
        // reading the environment yet.
        std::env::set_var("NCCL_NVLS_ENABLE", "0");
    }
    if let Some(pid) = std::env::var(SUPERVISOR_PID).ok().and_then(|p| p.parse().ok()) {
        stop_without_supervisor(rank, pid);
    }
    let (joined, waiting) = mpsc::channel::<()>();
    thread::spawn(move || {
        if waiting.recv_timeout(JOIN_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
            let peers = match backend {
                Backend::Ring => format!("the addresses in MLX_HOSTFILE ({})", std::env::var("MLX_HOSTFILE").unwrap_or_default()),
                Backend::Nccl => format!(
                    "rank 0 at NCCL_HOST_IP:NCCL_PORT ({}:{})",
                    std::env::var("NCCL_HOST_IP").unwrap_or_default(),
                    std::env::var("NCCL_PORT").unwrap_or_default()
                ),
            };
            eprintln!(
                "error: rank {rank} could not reach the other ranks in {} s: check that all {tp} ranks started with the same --tp and can reach {peers}",
                JOIN_TIMEOUT.as_secs()
            );
            exit_now(1);
        }
    });
    let group = TensorParallel::join(backend, tp);
    let _ = joined.send(());
    // On CUDA the sums go through the peers' memory where every rank can map the others'.
    Ok(crate::kernels::all_reduce::attach(&group?))
}

/// Ends the process at once: no exit handlers, which could wait on MLX's communication threads.
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes any status and does not return.
    unsafe { libc::_exit(code) }
}

/// A rank started by our supervisor ends when the supervisor is gone (killed, say), rather than
/// waiting on peers forever. The parent pid changes when a process is orphaned, on Linux and macOS.
fn stop_without_supervisor(rank: usize, supervisor: u32) {
    thread::spawn(move || loop {
        // SAFETY: getppid cannot fail.
        if unsafe { libc::getppid() } as u32 != supervisor {
            eprintln!("error: rank {rank}: the tensor-parallel supervisor (pid {supervisor}) is gone; stopping");
            exit_now(1);
        }
        thread::sleep(Duration::from_millis(500));
    });
}

/// The ring's hosts file, removed when the run ends.
struct Hostfile(PathBuf);

impl Hostfile {
    fn write(ports: &[u16]) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("sala-tp-{}.json", std::process::id()));
        let hosts: Vec<[String; 1]> = ports.iter().map(|p| [format!("127.0.0.1:{p}")]).collect();
        std::fs::write(&path, serde_json::to_string(&hosts)?).map_err(|source| Error::Io { path: path.clone(), source })?;
        Ok(Self(path))
    }
}

impl Drop for Hostfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `n` distinct ports free on 127.0.0.1 now (held together while chosen, so none repeats).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| anyhow::anyhow!("finding a free port on 127.0.0.1 for the ranks: {e}"))?;
    Ok(listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<std::io::Result<_>>()?)
}

/// The GPU each nccl rank gets: the r-th of CUDA_VISIBLE_DEVICES when set, else GPU r.
fn rank_gpus(tp: usize) -> anyhow::Result<Vec<String>> {
    let Ok(visible) = std::env::var("CUDA_VISIBLE_DEVICES") else { return Ok((0..tp).map(|r| r.to_string()).collect()) };
    let listed: Vec<String> = visible.split(',').map(|g| g.trim().to_string()).filter(|g| !g.is_empty()).collect();
    if listed.len() < tp {
        return Err(Error::Usage(format!(
            "--tp {tp} needs {tp} GPUs, but CUDA_VISIBLE_DEVICES={visible:?} lists {}: list more GPUs or lower --tp",
            listed.len()
        ))
        .into());
    }
    Ok(listed.into_iter().take(tp).collect())
}

/// A rank the supervisor started: its process and, for followers, its last stderr lines.
struct Rank {
    child: Child,
    status: Option<ExitStatus>,
    stderr: Option<StderrTail>,
}

/// The last lines a follower wrote to stderr, and the thread reading them.
struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    reader: JoinHandle<()>,
}

impl Rank {
    fn signal(&self, signal: i32) {
        if self.status.is_none() {
            // SAFETY: the child is not yet reaped, so its pid is still its own.
            unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        }
    }

    /// Its last stderr lines, once it has closed stderr.
    fn last_lines(&mut self) -> Vec<String> {
        let Some(StderrTail { lines, reader }) = self.stderr.take() else { return Vec::new() };
        let _ = reader.join();
        let lines = lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect()
    }
}

/// Keeps the last [`STDERR_LINES`] lines a follower writes to stderr.
fn keep_tail(stderr: impl std::io::Read + Send + 'static) -> StderrTail {
    let lines = Arc::new(Mutex::new(VecDeque::new()));
    let kept = lines.clone();
    let reader = thread::spawn(move || {
        let mut stderr = std::io::BufReader::new(stderr);
        let mut line = Vec::new();
        while stderr.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() == STDERR_LINES {
                kept.pop_front();
            }
            kept.push_back(text);
            line.clear();
        }
    });
    StderrTail { lines, reader }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}{}", signal_name(signal)),
        _ => format!("ended ({status})"),
    }
}

/// " (SIGKILL: …)": the signal's name, and what it usually means for a rank.
fn signal_name(signal: i32) -> String {
    let (name, meaning) = match signal {
        libc::SIGKILL => ("SIGKILL", ": killed from outside, by a user or by the kernel when memory ran out"),
        // MLX's ring writes to its sockets without MSG_NOSIGNAL, and sala keeps SIGPIPE's default.
        libc::SIGPIPE => ("SIGPIPE", ": a peer it was sending to, or the reader of its output, was gone"),
        libc::SIGSEGV => ("SIGSEGV", ": a crash"),
        libc::SIGABRT => ("SIGABRT", ": a crash"),
        libc::SIGBUS => ("SIGBUS", ": a crash"),
        libc::SIGTERM => ("SIGTERM", ""),
        libc::SIGINT => ("SIGINT", ""),
        libc::SIGHUP => ("SIGHUP", ""),
        _ => return String::new(),
    };
    format!(" ({name}{meaning})")
}

/// Ranks failing in the same poll, the likely cause first: one killed outright before one that
/// exited with an error, before one killed by SIGPIPE (a peer was gone); else in rank order.
fn cause_first(failures: &mut [usize], ranks: &[Rank]) {
    use std::os::unix::process::ExitStatusExt;
    failures.sort_by_key(|&r| match ranks[r].status.and_then(|s| s.signal()) {
        Some(libc::SIGPIPE) => 2,
        Some(_) => 0,
        None => 1,
    });
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The last SIGINT, SIGTERM or SIGHUP the supervisor got (0: none yet).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_signal(signal: libc::c_int) {
    SIGNALLED.store(signal, Ordering::SeqCst);
}

/// The supervisor notes SIGINT, SIGTERM and SIGHUP instead of dying of them, to pass them on to
/// its ranks and wait for them (a handler, not a mask: libraries may have started threads
/// already). The ranks start with default dispositions (exec resets caught signals), so each
/// still gets Ctrl-C from the terminal and dies of SIGTERM.
fn take_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, note_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// Starts `tp` copies of this program as the ranks of one group on this machine and waits for
/// them. Returns the exit code: rank 0's when all succeed, else the failed rank's.
fn supervise(tp: usize, backend: Backend) -> anyhow::Result<i32> {
    let ports = free_ports(tp)?;
    let hostfile = match backend {
        Backend::Ring => Some(Hostfile::write(&ports)?),
        Backend::Nccl => None,
    };
    let gpus = match backend {
        Backend::Nccl => rank_gpus(tp)?,
        Backend::Ring => vec![String::new(); tp],
    };
    let program = std::env::current_exe().map_err(|e| anyhow::anyhow!("finding this program to start its ranks: {e}"))?;
    eprintln!("tensor parallel: starting {tp} ranks over {} on this machine", backend.name());
    take_signals();
    let mut ranks = Vec::with_capacity(tp);
    for (r, gpu) in gpus.iter().enumerate() {
        let mut command = Command::new(&program);
        command
            .args(std::env::args_os().skip(1))
            .env("MLX_RANK", r.to_string())
            .env("MLX_WORLD_SIZE", tp.to_string())
            .env(SUPERVISOR_PID, std::process::id().to_string());
        match &hostfile {
            Some(hostfile) => {
                command.env("MLX_HOSTFILE", &hostfile.0).env_remove("NCCL_HOST_IP").env_remove("NCCL_PORT");
            }
            None => {
                command
                    .env("NCCL_HOST_IP", "127.0.0.1")
                    .env("NCCL_PORT", ports[0].to_string())
                    .env("CUDA_VISIBLE_DEVICES", gpu)
                    .env_remove("MLX_HOSTFILE");
                // NCCL_NVLS_ENABLE: each rank sets it when it joins (`join`).
            }
        }
        if r > 0 {
            command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                for started in &mut ranks {
                    stop(started);
                }
                anyhow::bail!("starting tensor-parallel rank {r} ({}): {e}", program.display());
            }
        };
        let stderr = child.stderr.take().map(keep_tail);
        ranks.push(Rank { child, status: None, stderr });
    }
    let code = watch(&mut ranks);
    drop(hostfile);
    Ok(code)
}

/// SIGTERM, then SIGKILL after [`KILL_AFTER`], and reaps.
fn stop(rank: &mut Rank) {
    rank.signal(libc::SIGTERM);
    let deadline = Instant::now() + KILL_AFTER;
    while rank.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let _ = rank.child.kill();
    let _ = rank.child.wait();
}

/// Waits for every rank; on the first failure (or hang after rank 0 ended) reports it and stops
/// the others. A failure by exit code waits up to [`CAUSE_SETTLES`] for a rank killed by a
/// signal, which is then named first. A signal to the supervisor goes to every rank; a rank
/// ending of it (or with 128 + it) is no failure. Returns the failed rank's code, else rank 0's.
fn watch(ranks: &mut [Rank]) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let size = ranks.len();
    let mut failed: Option<i32> = None;
    let mut passed_on: Vec<i32> = Vec::new();
    let mut kill_at: Option<Instant> = None;
    let mut leader_done: Option<Instant> = None;
    let mut ended_badly: Vec<usize> = Vec::new();
    let mut first_failure: Option<Instant> = None;
    loop {
        let signal = SIGNALLED.swap(0, Ordering::SeqCst);
        if signal != 0 {
            passed_on.push(signal);
            ranks.iter().for_each(|r| r.signal(signal));
            if signal != libc::SIGINT {
                kill_at.get_or_insert(Instant::now() + KILL_AFTER);
            }
        }
        for (r, rank) in ranks.iter_mut().enumerate() {
            if rank.status.is_some() {
                continue;
            }
            if let Ok(Some(status)) = rank.child.try_wait() {
                rank.status = Some(status);
                if !status.success() {
                    ended_badly.push(r);
                    first_failure.get_or_insert_with(Instant::now);
                } else if r == 0 {
                    leader_done = Some(Instant::now());
                }
            }
        }
        let cause_known = ended_badly.iter().any(|&r| ranks[r].status.is_some_and(|s| s.signal().is_some_and(|g| g != libc::SIGPIPE)))
            || ranks.iter().all(|r| r.status.is_some())
            || first_failure.is_some_and(|at| at.elapsed() >= CAUSE_SETTLES);
        if !ended_badly.is_empty() && cause_known && failed.is_none() && kill_at.is_none() {
            let ended_badly = std::mem::take(&mut ended_badly);
            let stopped_by_user = |status: ExitStatus| {
                passed_on.iter().any(|&s| status.signal() == Some(s) || status.code() == Some(128 + s))
            };
            let mut failures: Vec<usize> = ended_badly.into_iter().filter(|&r| !stopped_by_user(ranks[r].status.expect("ended"))).collect();
            cause_first(&mut failures, ranks);
            for &r in &failures {
                let status = ranks[r].status.expect("ended");
                report(r, size, status, ranks[r].last_lines());
            }
            if let Some(&first) = failures.first() {
                failed = Some(exit_code(ranks[first].status.expect("ended")));
                let running: Vec<String> = (0..size).filter(|&r| ranks[r].status.is_none()).map(|r| r.to_string()).collect();
                if !running.is_empty() {
                    eprintln!("tensor parallel: stopping rank(s) {}", running.join(", "));
                }
            }
            ranks.iter().for_each(|r| r.signal(libc::SIGTERM));
            kill_at = Some(Instant::now() + KILL_AFTER);
        }
        if let Some(done) = leader_done.filter(|d| kill_at.is_none() && d.elapsed() > FOLLOWERS_AFTER_LEADER) {
            let hung: Vec<String> = (0..size).filter(|&r| ranks[r].status.is_none()).map(|r| r.to_string()).collect();
            eprintln!(
                "error: tensor parallel: rank(s) {} still running {} s after rank 0 finished; stopping them",
                hung.join(", "),
                done.elapsed().as_secs()
            );
            failed = Some(1);
            ranks.iter().for_each(|r| r.signal(libc::SIGTERM));
            kill_at = Some(Instant::now() + KILL_AFTER);
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            for rank in ranks.iter_mut().filter(|r| r.status.is_none()) {
                let _ = rank.child.kill();
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    failed.unwrap_or_else(|| exit_code(ranks[0].status.expect("every rank ended")))
}

fn report(rank: usize, size: usize, status: ExitStatus, lines: Vec<String>) {
    let what = format!("error: tensor-parallel rank {rank} of {size} {}", describe(status));
    if rank == 0 && status.code().is_some() {
        eprintln!("{what} (its messages are above)");
    } else if rank == 0 {
        eprintln!("{what}");
    } else if lines.is_empty() {
        eprintln!("{what} and wrote nothing to stderr");
    } else {
        eprintln!("{what}; its last lines on stderr:");
        // MLX's ring repeats its "socket closed" line for every retry: each run of a line once.
        let mut i = 0;
        while i < lines.len() {
            let repeats = lines[i..].iter().take_while(|l| **l == lines[i]).count();
            let times = if repeats > 1 { format!(" ({repeats} times)") } else { String::new() };
            eprintln!("  [rank {rank}] {}{times}", lines[i]);
            i += repeats;
        }
    }
}

/// What `sala doctor --tp N` measured over the group.
pub struct GroupCheck {
    pub summary: String,
}

/// Bytes of the all_sum whose bandwidth doctor measures.
const BANDWIDTH_BYTES: usize = 16 << 20;
/// Small all_sums averaged for the latency.
const LATENCY_ROUNDS: u32 = 20;
/// All_sums one decoding token of MiniCPM-SALA-9B waits for when split over ranks: 2 per layer
/// × 32 layers + 24 lightning output norms.
const DECODE_ALL_SUMS: usize = 88;
/// All_sums in the timed chain of prefill-sized ones.
const PREFILL_ALL_SUMS: usize = 16;
/// MiniCPM-SALA-9B's hidden size: the width of every summed activation.
const HIDDEN: i32 = 4096;
/// Tokens in one prefill chunk.
const PREFILL_CHUNK: i32 = 2048;

/// Test-only (tests/tensor_parallel_launch.rs): the rank this names exits with status 3 right
/// after joining.
const TEST_EXIT_RANK: &str = "SALA_TP_TEST_EXIT_RANK";
/// Test-only: the rank this names waits forever right after joining (and so do its peers).
const TEST_HANG_RANK: &str = "SALA_TP_TEST_HANG_RANK";

/// Checks that the group's collectives give every rank the right answers and times them: an
/// all_sum of rank+1 (N(N+1)/2), an all_gather of the ranks (0..N), a broadcast from rank 0, an
/// agreement check, then one 16 MiB all_sum and the mean of [`LATENCY_ROUNDS`] 4-byte ones (each
/// with an eval's host round trip), then [`time_chain`]s of decode- and prefill-sized all_sums.
pub fn check_group(tp: &TensorParallel) -> anyhow::Result<GroupCheck> {
    if std::env::var(TEST_EXIT_RANK).is_ok_and(|r| r == tp.rank.to_string()) {
        eprintln!("rank {}: exiting with status 3 ({TEST_EXIT_RANK})", tp.rank);
        exit_now(3);
    }
    if std::env::var(TEST_HANG_RANK).is_ok_and(|r| r == tp.rank.to_string()) {
        eprintln!("rank {}: waiting forever ({TEST_HANG_RANK})", tp.rank);
        loop {
            thread::sleep(Duration::from_secs(3600));
        }
    }
    let (rank, size) = (tp.rank, tp.size);
    let backend = tp.backend().map_or("none", Backend::name);
    let expected_sum = (size * (size + 1) / 2) as f32;
    let sum = tp.all_sum(&Array::from_slice(&[rank as f32 + 1.0], &[1]))?;
    sum.eval()?;
    let sum = sum.as_slice::<f32>()[0];
    anyhow::ensure!(sum == expected_sum, "all_sum of rank+1 gave {sum} on rank {rank}, expected {expected_sum}");

    let gathered = tp.all_gather(&Array::from_slice(&[rank as i32], &[1]))?;
    gathered.eval()?;
    let gathered = gathered.as_slice::<i32>().to_vec();
    let ranks: Vec<i32> = (0..size as i32).collect();
    anyhow::ensure!(gathered == ranks, "all_gather of the ranks gave {gathered:?} on rank {rank}, expected {ranks:?}");

    let sent = [7, rank as i32 + 1];
    let received = tp.broadcast(&sent)?;
    anyhow::ensure!(received == [7, 1], "broadcast from rank 0 gave {received:?} on rank {rank}, expected [7, 1]");
    tp.check_agree(&[size as i64], "the group's size")?;

    let elements = BANDWIDTH_BYTES / 4;
    let big = mlx_rs::ops::full::<f32>(&[elements as i32], Array::from_f32(rank as f32 + 1.0))?;
    big.eval()?;
    let started = Instant::now();
    let summed = tp.all_sum(&big)?;
    summed.eval()?;
    let bandwidth_time = started.elapsed();
    let values = summed.as_slice::<f32>();
    anyhow::ensure!(
        values.iter().all(|v| *v == expected_sum),
        "the 16 MiB all_sum on rank {rank} does not hold {expected_sum} everywhere"
    );

    let one = Array::from_slice(&[1.0f32], &[1]);
    let started = Instant::now();
    for _ in 0..LATENCY_ROUNDS {
        tp.all_sum(&one)?.eval()?;
    }
    let latency = started.elapsed() / LATENCY_ROUNDS;

    let dtype = Dtype::Bfloat16;
    let decode = time_chain(tp, &[1, 1, HIDDEN], dtype, DECODE_ALL_SUMS)?;
    let prefill = time_chain(tp, &[1, PREFILL_CHUNK, HIDDEN], dtype, PREFILL_ALL_SUMS)?;
    // Where a faster path takes the sums, the backend's own collective timed beside it.
    let fast_sums = match tp.fast_sum_name() {
        Some(name) => {
            let own = tp.without_fast_sum();
            let decode = time_chain(&own, &[1, 1, HIDDEN], dtype, DECODE_ALL_SUMS)?;
            let prefill = time_chain(&own, &[1, PREFILL_CHUNK, HIDDEN], dtype, PREFILL_ALL_SUMS)?;
            format!("sums through {name} where it takes them (through {backend} alone: {}, {}); ", decode.describe(), prefill.describe())
        }
        None => String::new(),
    };

    let gbps = BANDWIDTH_BYTES as f64 / bandwidth_time.as_secs_f64() / 1e9;
    Ok(GroupCheck {
        summary: format!(
            "{size} ranks over {backend}: all_sum of rank+1 = {expected_sum}, all_gather = {gathered:?}, broadcast from rank 0 and agreement OK; \
             16 MiB all_sum {:.1} ms ({gbps:.2} GB/s), 4-byte all_sum {} µs (mean of {LATENCY_ROUNDS}); \
             {fast_sums}in one graph: {} ({:.2} ms a decode token), {} ({:.2} GB/s)",
            bandwidth_time.as_secs_f64() * 1e3,
            latency.as_micros(),
            decode.describe(),
            decode.total.as_secs_f64() * 1e3,
            prefill.describe(),
            prefill.gbps(),
        ),
    })
}

/// A timed chain of all_sums of one shape, evaluated as one graph.
struct Chain {
    count: usize,
    bytes: usize,
    dtype: Dtype,
    total: Duration,
}

impl Chain {
    fn each(&self) -> Duration {
        self.total / self.count as u32
    }

    /// Bytes each rank contributes per second, one all_sum after another.
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.each().as_secs_f64() / 1e9
    }

    /// "88 × 8 KiB bf16 all_sum 9.1 µs each", in µs below a millisecond and ms above.
    fn describe(&self) -> String {
        let size = if self.bytes >= 1 << 20 { format!("{} MiB", self.bytes >> 20) } else { format!("{} KiB", self.bytes >> 10) };
        let each = self.each().as_secs_f64();
        let each = if each < 1e-3 { format!("{:.1} µs", each * 1e6) } else { format!("{:.2} ms", each * 1e3) };
        let dtype = match self.dtype {
            Dtype::Bfloat16 => "bf16".to_string(),
            Dtype::Float32 => "f32".to_string(),
            other => format!("{other:?}"),
        };
        format!("{} × {size} {dtype} all_sum {each} each", self.count)
    }
}

/// Times `count` all_sums of a `shape` array of `dtype`, chained as in a forward pass (each sums
/// the previous result scaled back by 1/size, so none can be dropped or merged) and evaluated
/// once after one warm-up chain. Every rank builds the same chain. Refused unless it ends at 1.
fn time_chain(tp: &TensorParallel, shape: &[i32], dtype: Dtype, count: usize) -> anyhow::Result<Chain> {
    let ones = ops::ones_dtype(shape, dtype)?;
    let scale = Array::from_f32(1.0 / tp.size as f32).as_dtype(dtype)?;
    mlx_rs::transforms::eval([&ones, &scale])?;
    let chain = || -> anyhow::Result<Array> {
        let mut x = ones.clone();
        for _ in 0..count {
            x = tp.all_sum(&x)?.multiply(&scale)?;
        }
        Ok(x)
    };
    chain()?.eval()?;
    let out = chain()?;
    let started = Instant::now();
    out.eval()?;
    let total = started.elapsed();
    let worst = out.subtract(Array::from_f32(1.0).as_dtype(dtype)?)?.abs()?.max(None)?.try_item_cast::<f32>()?;
    anyhow::ensure!(
        worst < 1.0 / 64.0,
        "a chain of {count} all_sums of {dtype:?} {shape:?} ones, each scaled by 1/{}, is off 1 by {worst} on rank {}",
        tp.size,
        tp.rank
    );
    Ok(Chain { count, bytes: ones.nbytes(), dtype, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank_running(script: &str) -> Rank {
        let child = Command::new("sh").args(["-c", script]).stderr(Stdio::null()).spawn().unwrap();
        Rank { child, status: None, stderr: None }
    }

    /// A killed rank's peer may exit of the lost connection before the killed one can be reaped:
    /// the killed rank is still the cause, and its code the group's.
    #[test]
    fn a_rank_killed_after_its_peer_failed_is_still_the_cause() {
        let mut ranks = [rank_running("exit 1"), rank_running("sleep 0.5; kill -9 $$")];
        assert_eq!(watch(&mut ranks), 128 + libc::SIGKILL);
    }

    /// A plain failure with nothing else ending is reported once it has settled.
    #[test]
    fn a_lone_failure_stops_the_others() {
        let started = Instant::now();
        let mut ranks = [rank_running("exit 3"), rank_running("exec sleep 60")];
        assert_eq!(watch(&mut ranks), 3);
        assert!(ranks[1].status.is_some_and(|s| !s.success()), "the sleeping rank was stopped");
        assert!(started.elapsed() < CAUSE_SETTLES + KILL_AFTER, "took {:?}", started.elapsed());
    }
}
