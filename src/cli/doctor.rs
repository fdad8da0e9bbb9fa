//! `sala doctor`: what a user runs when something is wrong. Each check prints OK, WARN or FAIL
//! with what it found and, where something is off, the fix. Exits 1 when a check fails.

use super::TpArgs;
use crate::engine::device::{self, select, DeviceKind};
use crate::engine::distributed::TensorParallel;
use crate::launch;
use crate::kernels::custom::{backend, Backend};
use crate::kernels::selfcheck::{self, Status as KernelStatus};
use crate::store::cache::{self, cache_dir};
use crate::engine::memory::{available_bytes, human, total_bytes};
use crate::store::summary::summarize;
use clap::Args;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

#[derive(Args)]
#[command(
    after_help = "With --tp N (N > 1), doctor starts N ranks and runs only the tensor-parallel check: sums, gathers and a broadcast\nacross the ranks, one 16 MiB all_sum's bandwidth and a small one's latency, and the time of chains of all_sums\nevaluated as one graph, as a decoding token (88 of [1, 1, 4096]) and a prefill chunk (16 of [1, 2048, 4096]) see them.\n\nExamples:\n  sala doctor\n  sala doctor --json | jq '.checks[] | select(.status != \"ok\")'\n  sala doctor --tp 2"
)]
pub struct DoctorArgs {
    /// Print JSON ({"ok": bool, "checks": [{name, status, found, fix}]}) instead of lines
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tp: TpArgs,
}

/// The MLX release sala is built and tested against.
const MLX_TESTED: &str = "0.32.2";
/// Below this much free memory the 8-bit 9B model (10.4 GB of weights) does not load with room
/// for a cache; the 4-bit one (5.8 GB) may.
const MEMORY_FOR_9B_Q8: u64 = 12 << 30;
/// Free disk for one more 8-bit 9B model in the store.
const DISK_FOR_9B_Q8: u64 = 11 << 30;

#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Serialize, Debug)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// What was found.
    pub found: String,
    /// What to do about it (absent when the check is OK).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, found: impl Into<String>) -> Self {
        Self { name, status: Status::Ok, found: found.into(), fix: None }
    }
    fn warn(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Warn, found: found.into(), fix: Some(fix.into()) }
    }
    fn fail(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Fail, found: found.into(), fix: Some(fix.into()) }
    }
}

pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let checks = match args.tp.rank(None)? {
        tp if tp.is_single() => checks(),
        tp => {
            let check = tp_check(&tp);
            if !tp.is_leader() {
                // Rank 0 speaks; a follower only says what went wrong on its side.
                if check.status == Status::Fail {
                    eprintln!("error: {}", check.found);
                    std::process::exit(1);
                }
                return Ok(());
            }
            vec![check]
        }
    };
    let ok = checks.iter().all(|c| c.status != Status::Fail);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "ok": ok, "checks": checks }))?);
    } else {
        for c in &checks {
            let status = match c.status {
                Status::Ok => "OK  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("{status}  {:<9} {}", c.name, c.found);
            if let Some(fix) = &c.fix {
                println!("{:16}fix: {fix}", "");
            }
        }
    }
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

fn tp_check(tp: &TensorParallel) -> Check {
    match launch::check_group(tp) {
        Ok(group) => Check::ok("tp", group.summary),
        Err(e) => Check::fail(
            "tp",
            format!("rank {} of {}: {e:#}", tp.rank, tp.size),
            "the ranks' own messages say more (NCCL_DEBUG=INFO for nccl, MLX_RING_VERBOSE=1 for ring); --tp 1 runs on one device meanwhile",
        ),
    }
}

/// Every check, in the order a user reads them: the build, the hardware, the store, the hub.
pub fn checks() -> Vec<Check> {
    let mut out = vec![
        Check::ok("sala", format!("{} ({} {})", env!("CARGO_PKG_VERSION"), std::env::consts::OS, std::env::consts::ARCH)),
        mlx_check(),
        gpu_check(),
    ];
    out.extend(blas_check());
    out.extend(kernel_checks());
    out.push(memory_check());
    out.extend(store_checks(&cache_dir()));
    out.push(token_check());
    out.push(hub_check());
    out
}

fn mlx_check() -> Check {
    let version = device::mlx_version();
    let backend = device::gpu_backend().unwrap_or("cpu only");
    let found = format!("MLX {version}, backend {backend}");
    if version == MLX_TESTED {
        Check::ok("mlx", found)
    } else {
        Check::warn(
            "mlx",
            found,
            format!("sala is built and tested against MLX {MLX_TESTED}: rebuild (cargo build --release) so build.rs fetches it, or point MLX_LINK_DIR at a {MLX_TESTED} libmlx"),
        )
    }
}

fn gpu_check() -> Check {
    match device::gpu_info() {
        Some(info) => {
            let memory = info.memory_bytes.map_or(String::new(), |b| format!(", {}", human(b)));
            let name = info.name.unwrap_or_else(|| "unnamed".into());
            // A tiny product on the GPU: a driver or runtime mismatch shows up here, not later.
            match gpu_smoke_test() {
                Ok(()) => {
                    let units = device::gpu_compute_units().map_or(String::new(), |n| format!(", {n} compute units"));
                    Check::ok("gpu", format!("{name}{memory}{units} ({})", device::gpu_backend().unwrap_or("?")))
                }
                Err(e) => Check::fail(
                    "gpu",
                    format!("{name}{memory}: a test product failed: {e}"),
                    "check the driver (nvidia-smi) and that libmlx matches it (mlx-cuda-13 needs a CUDA 13 driver); --device cpu runs meanwhile",
                ),
            }
        }
        None if device::gpu_backend().is_some() => Check::fail(
            "gpu",
            format!("this libmlx is built for {} but finds no usable GPU", device::gpu_backend().unwrap_or("?")),
            "check the driver (nvidia-smi shows the GPU?) or run with --device cpu",
        ),
        None => Check::warn(
            "gpu",
            "none: this libmlx is the CPU build, models run on the CPU",
            if cfg!(target_os = "linux") {
                "on an NVIDIA machine, link the CUDA MLX: pip install mlx-cuda-13==0.32.2, then build with MLX_LINK_DIR=<its mlx/lib> (README, \"NVIDIA GPUs\")"
            } else {
                "build on macOS with Metal (the default there)"
            },
        ),
    }
}

fn gpu_smoke_test() -> anyhow::Result<()> {
    use mlx_rs::{Array, Device};
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let product = mlx_rs::with_device(Device::gpu(), || a.matmul(&a))?;
    product.eval()?;
    let got = product.as_slice::<f32>().to_vec();
    anyhow::ensure!(got == [7.0, 10.0, 15.0, 22.0], "got {got:?}, expected [7, 10, 15, 22]");
    Ok(())
}

/// Linux CPU build: whether OpenBLAS was linked ahead of the MLX wheel's reference BLAS (see
/// build.rs). With a GPU backend the products run on the GPU and this does not matter.
fn blas_check() -> Option<Check> {
    if device::gpu_backend().is_some() {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let lib = maps.split_whitespace().find(|w| w.contains("libopenblas"));
    Some(match lib {
        Some(path) => Check::ok("blas", format!("OpenBLAS ({path})")),
        None => Check::warn(
            "blas",
            "MLX's reference BLAS: float32 products on the CPU run about 50× slower",
            "install OpenBLAS (Debian/Ubuntu: apt install libopenblas0-pthread) and rebuild; build.rs links it ahead of MLX",
        ),
    })
}

/// sala's GPU kernels: on a GPU each runs its self-check (against its MLX-ops version) and gets a
/// line; elsewhere one line says they are not used.
fn kernel_checks() -> Vec<Check> {
    let checks = crate::models::kernel_checks();
    if std::env::var("SALA_KERNELS").is_ok_and(|v| v == "off" || v == "0") {
        return vec![Check::warn("kernels", "SALA_KERNELS=off: sala's GPU kernels are replaced by slower MLX-ops versions", "unset SALA_KERNELS")];
    }
    if select(Some(DeviceKind::Gpu)).is_err() || backend() == Backend::Cpu {
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        return vec![Check::ok("kernels", format!("not used on cpu, the MLX-ops versions run ({})", names.join(", ")))];
    }
    let gpu = backend().name();
    // Their kernels compile side by side first, not one check at a time.
    selfcheck::compile_ahead(&checks, true, |_, _| {});
    checks
        .iter()
        .map(|check| {
            selfcheck::recheck(check);
            match selfcheck::status(check) {
                KernelStatus::Verified => Check::ok("kernel", format!("{}: verified on {gpu}", check.name)),
                KernelStatus::NotUsed => Check::ok("kernel", format!("{}: not used on {gpu} (CUDA only; the MLX-ops version runs)", check.name)),
                KernelStatus::Disabled(reason) => Check::warn(
                    "kernel",
                    format!("{}: switched off on {gpu}, the MLX-ops version runs: {reason}", check.name),
                    "results stay right, only slower; please report this line (sala doctor --json) with the GPU and OS",
                ),
                other => Check::warn("kernel", format!("{}: {other:?} on {gpu}", check.name), "run sala doctor again"),
            }
        })
        .collect()
}

/// Memory of the device models run on by default: the GPU's own on CUDA, unified memory on
/// Metal, host memory on the CPU.
fn memory_check() -> Check {
    let device = device::or_default(None);
    let total = total_bytes(device);
    let of_total = total.map_or(String::new(), |t| format!(" of {} ({})", human(t), device::describe(device)));
    match available_bytes(device) {
        Some(free) if free < MEMORY_FOR_9B_Q8 => Check::warn(
            "memory",
            format!("{} available{of_total}", human(free)),
            "MiniCPM-SALA-9B 8-bit needs about 10.4 GB plus its cache: close other programs, or quantize to 4 bits (sala quantize --bits 4, 5.8 GB)",
        ),
        Some(free) => Check::ok("memory", format!("{} available{of_total}", human(free))),
        None => Check::warn(
            "memory",
            format!("available memory unknown on this system{of_total}"),
            "sala cannot check that a model fits before loading it; set SALA_AVAILABLE_MEMORY=<bytes> to enable the check",
        ),
    }
}

fn store_checks(store: &Path) -> Vec<Check> {
    let source = if std::env::var_os("HF_HUB_CACHE").is_some() {
        "HF_HUB_CACHE"
    } else if std::env::var_os("HF_HOME").is_some() {
        "HF_HOME"
    } else {
        "default"
    };
    let at = format!("{} ({source})", store.display());
    if store.exists() && !store.is_dir() {
        return vec![Check::fail("store", format!("{at} is not a directory"), "set HF_HUB_CACHE (or HF_HOME) to a directory")];
    }
    let mut out = Vec::new();
    match writable(store) {
        Ok(()) => {}
        Err(e) => {
            out.push(Check::fail("store", format!("{at} cannot be written: {e}"), "set HF_HUB_CACHE (or HF_HOME) to a writable directory"));
            return out;
        }
    }
    let models = match cache::list(store) {
        Ok(m) => m,
        Err(e) => return vec![Check::fail("store", format!("{at}: {e}"), "check the directory's permissions")],
    };
    let free = free_disk_bytes(store);
    let free_text = free.map_or(String::new(), |f| format!(", {} free on its disk", human(f)));
    let total: u64 = models.iter().map(|m| m.size).sum();
    let found = format!("{at}: {} model(s), {}{free_text}", models.len(), human(total));
    let mut fixes = Vec::new();
    if models.is_empty() {
        fixes.push("fetch a model: sala pull (MiniCPM-SALA-9B 8-bit), or pass --model DIR");
    }
    if free.is_some_and(|f| f < DISK_FOR_9B_Q8) {
        fixes.push("less free disk than one 8-bit 9B model (10.4 GB): free space, or set HF_HUB_CACHE to a larger disk");
    }
    out.push(if fixes.is_empty() { Check::ok("store", found) } else { Check::warn("store", found, fixes.join("; ")) });
    for m in &models {
        out.push(match summarize(&m.snapshot, None) {
            Ok((s, _)) => Check::ok("model", format!("{}: {}, {}, {}", m.name, s.model_type, s.quantization, human(m.size))),
            Err(e) => Check::warn(
                "model",
                format!("{}: cannot be loaded: {e}", m.name),
                format!("download it again: sala rm {0} && sala pull {0}", m.name),
            ),
        });
    }
    out
}

/// Whether a file can be created in `dir` (made if missing, as `sala pull` would).
fn writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".sala-doctor-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}

fn free_disk_bytes(dir: &Path) -> Option<u64> {
    // `df` is on every Linux and macOS; POSIX output, 1024-byte blocks.
    let out = std::process::Command::new("df").arg("-Pk").arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let kb: u64 = text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(kb * 1024)
}

fn token_check() -> Check {
    if std::env::var("HF_TOKEN").is_ok_and(|t| !t.trim().is_empty()) {
        return Check::ok("token", "HF_TOKEN is set (gated and private models can be pulled)");
    }
    let home = std::env::var_os("HF_HOME").map(std::path::PathBuf::from).unwrap_or_else(|| cache::user_cache_dir().join("huggingface"));
    let file = home.join("token");
    if file.is_file() {
        return Check::warn(
            "token",
            format!("{} exists but sala reads only HF_TOKEN", file.display()),
            format!("export HF_TOKEN=$(cat {})", file.display()),
        );
    }
    Check::ok("token", "none (public models only; set HF_TOKEN for gated ones)")
}

fn hub_check() -> Check {
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    if crate::store::pull::offline() {
        return Check::warn(
            "hub",
            format!("HF_HUB_OFFLINE is set: sala pull uses only the store (endpoint {endpoint} not tried)"),
            "unset HF_HUB_OFFLINE to download",
        );
    }
    match reach(&endpoint) {
        Ok(()) => Check::ok("hub", format!("{endpoint} reachable")),
        Err(e) => Check::warn(
            "hub",
            format!("{endpoint} not reachable: {e}"),
            "models already in the store still run; set HF_ENDPOINT to a mirror (e.g. https://hf-mirror.com), or HF_HUB_OFFLINE=1 to skip the network",
        ),
    }
}

/// Whether a TCP connection to the endpoint's host opens within a few seconds.
fn reach(endpoint: &str) -> Result<(), String> {
    use std::net::{TcpStream, ToSocketAddrs};
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let host = rest.split('/').next().unwrap_or(rest);
    let with_port = if host.contains(':') { host.to_string() } else if endpoint.starts_with("http://") { format!("{host}:80") } else { format!("{host}:443") };
    let addrs = with_port.to_socket_addrs().map_err(|e| format!("cannot resolve {host}: {e}"))?;
    let mut last = format!("no address for {host}");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}
