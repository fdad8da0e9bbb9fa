//! MLX's ring backend from sala on this machine: two processes (this test binary again, one per
//! rank) on 127.0.0.1 sum and gather arrays.

use sala::engine::distributed::{Backend, TensorParallel};
use std::process::Command;

const CHILD: &str = "SALA_TEST_DISTRIBUTED_RANK";

/// Run by each rank (ignored in a plain run: it needs the environment the parent gives it).
#[test]
#[ignore = "a rank of ring_backend_sums_over_two_processes"]
fn ring_rank() {
    let Ok(rank) = std::env::var(CHILD) else { return };
    let tp = TensorParallel::join(Backend::Ring, 2).unwrap();
    assert_eq!(tp.rank.to_string(), rank);
    assert_eq!(tp.size, 2);
    let r = tp.rank as f32;
    let x = mlx_rs::Array::from_slice(&[r + 1.0, 10.0 * (r + 1.0)], &[2]);
    let sum = tp.all_sum(&x).unwrap();
    let gathered = tp.all_gather(&x).unwrap();
    let broadcast = tp.broadcast(&[tp.rank as i32 + 5, 7]).unwrap();
    println!(
        "RESULT rank={} sum={:?} gathered={:?} broadcast={broadcast:?}",
        tp.rank,
        sum.as_slice::<f32>(),
        gathered.as_slice::<f32>()
    );
    tp.check_agree(&[3, 4], "a constant").unwrap();
    let differs = tp.check_agree(&[tp.rank as i64], "the rank").unwrap_err().to_string();
    assert!(differs.contains("disagree on the rank"), "{differs}");
}

#[test]
fn ring_backend_sums_over_two_processes() {
    assert!(sala::engine::distributed::is_available(Backend::Ring), "the MLX build has no ring backend");
    let ports: Vec<u16> = (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let hostfile = std::env::temp_dir().join(format!("sala-ring-{}.json", std::process::id()));
    let hosts: Vec<Vec<String>> = ports.iter().map(|p| vec![format!("127.0.0.1:{p}")]).collect();
    std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "ring_rank", "--include-ignored", "--nocapture"])
                .env(CHILD, rank.to_string())
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .spawn_output()
        })
        .collect();
    for (rank, out) in ranks.into_iter().map(|c| c.join().unwrap()).enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "rank {rank}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("RESULT rank={rank} sum=[3.0, 30.0] gathered=[1.0, 10.0, 2.0, 20.0] broadcast=[5, 7]")), "{stdout}");
    }
    std::fs::remove_file(hostfile).unwrap();
}

trait SpawnOutput {
    fn spawn_output(&mut self) -> std::thread::JoinHandle<std::process::Output>;
}

impl SpawnOutput for Command {
    fn spawn_output(&mut self) -> std::thread::JoinHandle<std::process::Output> {
        let child = self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        std::thread::spawn(move || child.wait_with_output().unwrap())
    }
}

/// A rank without the ring's environment gets an error, not an exit.
#[test]
#[ignore = "a rank of a_ring_without_its_environment_is_an_error"]
fn lone_rank() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let error = TensorParallel::join(Backend::Ring, 2).expect_err("no hostfile: joining must fail");
    println!("ERROR {error}");
}

#[test]
fn a_ring_without_its_environment_is_an_error() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "lone_rank", "--include-ignored", "--nocapture"])
        .env(CHILD, "0")
        .env_remove("MLX_HOSTFILE")
        .env_remove("MLX_RANK")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("ERROR MLX could not start its `ring` backend"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}
