//! `--tp N`'s launcher through `sala doctor --tp N` on this machine (ring backend on 127.0.0.1):
//! the ranks start, sum, gather and broadcast together and time chains of all_sums; a rank that
//! dies is named with its status and last words and no rank is left behind, in doctor and in the
//! middle of a real `sala run --tp 2`; a rank whose supervisor is gone stops; bad settings are
//! refused, `serve --tp` ones before any rank starts.

mod common;

use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn sala() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sala"));
    // A clean start: no rank environment from outside, nothing slow in plain doctor.
    for var in ["MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT", "SALA_TP_SUPERVISOR_PID", "SALA_TP_TEST_EXIT_RANK"] {
        command.env_remove(var);
    }
    command.env("HF_HUB_OFFLINE", "1");
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn doctor_tp(n: usize, extra: &[&str]) -> Output {
    sala().args(["doctor", "--tp", &n.to_string(), "--tp-backend", "ring"]).args(extra).output().unwrap()
}

#[test]
fn two_ranks_sum_gather_and_broadcast() {
    let out = doctor_tp(2, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("tensor parallel: starting 2 ranks over ring"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "only the tensor-parallel check, printed once (by rank 0): {stdout}");
    let line = lines[0];
    assert!(line.starts_with("OK    tp        2 ranks over ring: all_sum of rank+1 = 3, all_gather = [0, 1], broadcast from rank 0 and agreement OK; 16 MiB all_sum "), "{line}");
    assert!(line.contains(" GB/s), 4-byte all_sum ") && line.contains(" µs (mean of 20); in one graph: "), "{line}");
    assert_chains_timed(line);
}

/// Seconds in "9.1 µs" or "0.41 ms".
fn seconds(value: &str, unit: &str) -> f64 {
    value.parse::<f64>().unwrap() * if unit == "µs" { 1e-6 } else { 1e-3 }
}

/// The check ends with the two chains' figures, positive and consistent with each other.
fn assert_chains_timed(found: &str) {
    let pattern = regex::Regex::new(
        r"; in one graph: 88 × 8 KiB bf16 all_sum ([0-9.]+) (µs|ms) each \(([0-9.]+) ms a decode token\), 16 × 16 MiB bf16 all_sum ([0-9.]+) (µs|ms) each \(([0-9.]+) GB/s\)$",
    )
    .unwrap();
    let caps = pattern.captures(found).unwrap_or_else(|| panic!("no chain figures: {found}"));
    let decode_each = seconds(&caps[1], &caps[2]);
    let decode_token = seconds(&caps[3], "ms");
    let prefill_each = seconds(&caps[4], &caps[5]);
    let gbps: f64 = caps[6].parse().unwrap();
    assert!(decode_each > 0.0 && decode_token > 0.0 && prefill_each > 0.0 && gbps > 0.0, "{found}");
    // Rounded figures: the token is 88 all_sums, the bandwidth 16 MiB per all_sum.
    assert!((decode_token / (88.0 * decode_each) - 1.0).abs() < 0.1, "{decode_token} s vs 88 × {decode_each} s: {found}");
    let implied = (16 << 20) as f64 / prefill_each / 1e9;
    assert!((gbps - implied).abs() < 0.1 * implied + 0.005, "{gbps} GB/s vs {implied} GB/s implied: {found}");
}

#[test]
fn three_ranks_sum_to_six() {
    let out = doctor_tp(3, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("3 ranks over ring: all_sum of rank+1 = 6, all_gather = [0, 1, 2]"), "{stdout}");
}

#[test]
fn the_json_form_holds_the_tensor_parallel_check() {
    let out = doctor_tp(2, &["--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert_eq!(v["ok"], true);
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 1, "{v}");
    assert_eq!(checks[0]["name"], "tp");
    assert_eq!(checks[0]["status"], "ok");
    let found = checks[0]["found"].as_str().unwrap();
    assert!(found.starts_with("2 ranks over ring: all_sum of rank+1 = 3"), "{v}");
    assert_chains_timed(found);
    assert!(checks[0].get("fix").is_none(), "{v}");
}

/// Processes (Linux: from /proc) started by the supervisor `pid`: their environment names it.
fn ranks_of(pid: u32) -> Vec<u32> {
    let marker = format!("SALA_TP_SUPERVISOR_PID={pid}");
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| std::fs::read(format!("/proc/{p}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes())))
        .collect()
}

#[test]
fn a_rank_that_dies_is_named_and_no_rank_is_left() {
    let started = Instant::now();
    let child = sala()
        .args(["doctor", "--tp", "3", "--tp-backend", "ring"])
        .env("SALA_TP_TEST_EXIT_RANK", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let supervisor = child.id();
    let out = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("error: tensor-parallel rank 1 of 3 exited with status 3; its last lines on stderr:"), "{stderr}");
    // Its own last words, kept by the supervisor.
    assert!(stderr.contains("  [rank 1] rank 1: exiting with status 3 (SALA_TP_TEST_EXIT_RANK)"), "{stderr}");
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}: {stderr}");
    if cfg!(target_os = "linux") {
        let left = ranks_of(supervisor);
        assert!(left.is_empty(), "ranks {left:?} of supervisor {supervisor} still run");
    }
}

#[test]
fn a_rank_whose_supervisor_is_gone_stops() {
    // Rank 0 of two with no rank 1: the ring would wait forever for it. Its supervisor's pid is
    // not its parent's (this test is the parent), so it is taken for gone.
    let hostfile = std::env::temp_dir().join(format!("sala-tp-lone-{}.json", std::process::id()));
    let ports: Vec<u16> = (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    std::fs::write(&hostfile, format!(r#"[["127.0.0.1:{}"],["127.0.0.1:{}"]]"#, ports[0], ports[1])).unwrap();
    let started = Instant::now();
    let out = sala()
        .args(["doctor", "--tp", "2"])
        .env("MLX_RANK", "0")
        .env("MLX_HOSTFILE", &hostfile)
        .env("SALA_TP_SUPERVISOR_PID", "1")
        .output()
        .unwrap();
    std::fs::remove_file(&hostfile).unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: rank 0: the tensor-parallel supervisor (pid 1) is gone; stopping"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

#[test]
fn bad_settings_are_refused() {
    let out = sala().args(["doctor", "--tp", "0"]).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: --tp 0: give the number of devices to split the model over (1 or more)"), "{stderr}");

    let out = sala().args(["doctor", "--tp", "2", "--tp-backend", "mpi"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("[possible values: auto, ring, nccl]"), "{}", text(&out.stderr));

    let out = sala().args(["doctor", "--tp", "2"]).env("MLX_RANK", "one").output().unwrap();
    assert!(text(&out.stderr).contains("error: MLX_RANK=\"one\" is not a rank number"), "{}", text(&out.stderr));

    if sala::engine::device::gpu_backend() != Some("cuda") {
        let out = sala().args(["doctor", "--tp", "2", "--tp-backend", "nccl"]).output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("error: --tp-backend nccl: this MLX build has no NCCL (it comes with the CUDA build of MLX); use --tp-backend ring"), "{stderr}");
        assert!(!stderr.contains("starting"), "refused before any rank starts: {stderr}");
    }
}

#[test]
fn tp_one_is_plain_doctor() {
    let out = sala().args(["doctor", "--tp", "1", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    let names: Vec<&str> = v["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert!(names.starts_with(&["sala", "mlx", "gpu"]) && !names.contains(&"tp"), "{names:?}");
    assert!(!text(&out.stderr).contains("tensor parallel"), "{}", text(&out.stderr));
}

/// `sala doctor --tp 2` whose rank 0 waits forever after joining (rank 1 then waits in its first
/// all_sum), once rank 0 says so; and what it writes to stderr.
fn hanging_group() -> (std::process::Child, std::sync::Arc<std::sync::Mutex<String>>) {
    use std::io::BufRead;
    let mut child = sala()
        .args(["doctor", "--tp", "2", "--tp-backend", "ring"])
        .env("SALA_TP_TEST_HANG_RANK", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (said, heard) = std::sync::mpsc::channel();
    let written = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let kept = written.clone();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("rank 0: waiting forever (SALA_TP_TEST_HANG_RANK)") {
                let _ = said.send(());
            }
            kept.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    heard.recv_timeout(Duration::from_secs(60)).expect("rank 0 did not join within 60 s");
    (child, written)
}

fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < limit, "still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_signal_to_the_supervisor_stops_every_rank_quietly() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let (mut child, stderr) = hanging_group();
        let supervisor = child.id();
        if cfg!(target_os = "linux") {
            assert_eq!(ranks_of(supervisor).len(), 2, "both ranks run");
        }
        // SAFETY: the pid of our own unreaped child.
        unsafe { libc::kill(supervisor as libc::pid_t, signal) };
        let status = wait_at_most(&mut child, Duration::from_secs(15));
        assert_eq!(status.code(), Some(128 + signal), "rank 0 died of the signal passed on: {status}");
        let left = ranks_of(supervisor);
        assert!(left.is_empty(), "ranks {left:?} still run");
        // Stopped by the user: no rank is reported as failed.
        std::thread::sleep(Duration::from_millis(100));
        let stderr = stderr.lock().unwrap().clone();
        assert!(!stderr.contains("error"), "signal {signal}: {stderr}");
    }
}

#[test]
fn ranks_stop_when_their_supervisor_is_killed() {
    let (mut child, _) = hanging_group();
    let supervisor = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    let started = Instant::now();
    loop {
        let left = ranks_of(supervisor);
        if left.is_empty() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "ranks {left:?} still run 10 s after their supervisor was killed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fields of /proc/PID/stat after the command name: [0] state, [1] parent pid, [11] utime,
/// [12] stime (clock ticks).
fn stat_of(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().map(str::to_string).collect())
}

/// The rank `rank` the supervisor `pid` started: its child whose environment holds MLX_RANK=rank.
fn rank_pid(supervisor: u32, rank: usize) -> Option<u32> {
    let marker = format!("MLX_RANK={rank}");
    ranks_of(supervisor).into_iter().find(|&p| {
        stat_of(p).is_some_and(|f| f[1] == supervisor.to_string())
            && std::fs::read(format!("/proc/{p}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
    })
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_of(pid)?;
    // SAFETY: sysconf only reads a setting.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((f[11].parse::<f64>().ok()? + f[12].parse::<f64>().ok()?) / ticks)
}

/// Everything `child` writes to stderr, gathered by a thread as it comes.
fn gather_stderr(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let mut stderr = child.stderr.take().unwrap();
    let written = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let kept = written.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            kept.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    written
}

/// A rank SIGKILLed while `sala run --tp 2` generates (a million tokens of golden case A, minutes
/// on this CPU): once both ranks have used 1 s of CPU (a whole one-token run takes 0.2 s, so
/// they are decoding, each step an all_sum with the other), `victim` is killed. The supervisor
/// must exit within 30 s with the victim's status, name it first, and leave no rank running.
/// Returns its stderr.
fn kill_a_rank_mid_run(victim: usize) -> String {
    let mut child = sala()
        .args(["run", "--model"])
        .arg(common::golden("A_dense_f32"))
        .args(["--input-ids", "1,2,3", "--temperature", "0", "--ignore-eos", "--max-tokens", "1000000"])
        .args(["--device", "cpu", "--dtype", "f32", "--json", "--tp", "2", "--tp-backend", "ring"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let supervisor = child.id();
    let stderr = gather_stderr(&mut child);
    let started = Instant::now();
    let ranks = loop {
        let ranks = [rank_pid(supervisor, 0), rank_pid(supervisor, 1)];
        if let [Some(r0), Some(r1)] = ranks {
            if cpu_seconds(r0).unwrap_or(0.0) >= 1.0 && cpu_seconds(r1).unwrap_or(0.0) >= 1.0 {
                break [r0, r1];
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before rank {victim} was killed: {}", stderr.lock().unwrap());
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the ranks did not both use 1 s of CPU within 120 s: {}", stderr.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // SAFETY: kill only sends a signal; the pid is a rank of our supervisor, still running.
    assert_eq!(unsafe { libc::kill(ranks[victim] as libc::pid_t, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    let elapsed = killed.elapsed();
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let stderr = stderr.lock().unwrap().clone();
    assert_eq!(status.code(), Some(128 + libc::SIGKILL), "the supervisor exits with the killed rank's code: {stderr}");
    assert_eq!(stdout, "", "no answer from a broken run");
    let first_error = stderr.lines().find(|l| l.starts_with("error: tensor-parallel rank")).unwrap_or_else(|| panic!("no rank reported: {stderr}"));
    let expected = format!(
        "error: tensor-parallel rank {victim} of 2 was killed by signal 9 (SIGKILL: killed from outside, by a user or by the kernel when memory ran out)"
    );
    assert!(first_error.starts_with(&expected), "the killed rank is named first: {stderr}");
    let left = ranks_of(supervisor);
    assert!(left.is_empty(), "ranks {left:?} still run after the supervisor exited: {stderr}");
    for pid in ranks {
        assert!(stat_of(pid).is_none_or(|f| f[0] == "Z"), "rank pid {pid} still runs");
    }
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    stderr
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "finds the ranks through /proc")]
fn a_follower_killed_mid_run_is_named_and_stops_the_group() {
    let stderr = kill_a_rank_mid_run(1);
    assert!(stderr.contains("killed from outside, by a user or by the kernel when memory ran out) and wrote nothing to stderr"), "{stderr}");
    // Rank 0 is stopped by the supervisor or ends on its own (its peer is gone): either way it is
    // not taken for the cause.
    assert!(!stderr.contains("error: tensor-parallel rank 0 of 2 was killed by signal 9"), "{stderr}");
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "finds the ranks through /proc")]
fn rank_zero_killed_mid_run_is_named_and_its_follower_stopped() {
    let stderr = kill_a_rank_mid_run(0);
    // Rank 1 would wait in its next all_sum: the supervisor stops it, or it ends of its broken
    // socket and is reported after rank 0.
    let stopped = stderr.contains("tensor parallel: stopping rank(s) 1");
    let ended = stderr.contains("error: tensor-parallel rank 1 of 2 ");
    assert!(stopped || ended, "{stderr}");
    if ended {
        let (zero, one) = (stderr.find("error: tensor-parallel rank 0 of 2").unwrap(), stderr.find("error: tensor-parallel rank 1 of 2").unwrap());
        assert!(zero < one, "the killed rank is reported first: {stderr}");
    }
}

/// `cmd`'s status and stderr, failing if it runs past `limit` (a refusal that did not happen
/// would start a server).
fn output_within(cmd: &mut Command, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = gather_stderr(&mut child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let supervisor = child.id();
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_secs(1));
            for pid in ranks_of(supervisor) {
                // SAFETY: a rank left by the supervisor this test started.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            panic!("still running after {limit:?}: {}", stderr.lock().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(100));
    let stderr = stderr.lock().unwrap().clone();
    (status, stderr)
}

#[test]
fn serve_tp_refuses_what_it_cannot_split_before_any_rank_starts() {
    let cache_dir = std::env::temp_dir().join(format!("sala-tp-serve-cache-{}", std::process::id()));
    let (status, stderr) = output_within(
        sala()
            .args(["serve", "--tp", "2", "--tp-backend", "ring", "--device", "cpu", "--port", "0", "--model"])
            .arg(common::golden("A_dense_f32"))
            .arg("--prompt-cache-dir")
            .arg(&cache_dir),
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "error: --prompt-cache-dir cannot be used with --tp yet: each rank holds only its part of a prompt's state; drop one of them"
    );
    assert!(!cache_dir.exists(), "nothing written to {}", cache_dir.display());

    let (status, stderr) = output_within(
        sala().args(["serve", "--tp", "2", "--tp-backend", "ring", "--device", "cpu", "--port", "0"]),
        Duration::from_secs(30),
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "error: serve --tp serves one model split over the devices: give it with --model (serving the store is one device's)"
    );
}
