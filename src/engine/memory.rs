//! Will it fit? Memory a model needs (weights in the compute dtype + one sequence's cache) against
//! what the machine has, checked before loading and before prefill so an oversized request is
//! refused with the numbers instead of crashing the machine.

use super::device::{self, DeviceKind};
use super::error::{Error, Result};
use super::source::ModelSource;
use super::weights::float_dtype;
use mlx_rs::Dtype;

/// Returns the buffers MLX keeps cached for reuse to the system (after a model is dropped, so
/// the memory shows as free to the next memory check).
pub fn release_cached() {
    let _ = mlx_rs::memory::clear_cache();
}

/// Keeps MLX's cache of freed buffers well below its bound (CUDA, where [`device::select`] sets
/// one): a cache at its bound frees what a step frees instead of keeping it, so each later step
/// allocates afresh (a server that had served long prompts decoded 1.4× slower for the rest of
/// its life). Once the cache passes half its bound, the buffers freed longest ago go, down to a
/// quarter: what a long prompt or the loading left behind, not the buffers each step reuses.
/// Cheap enough to call every scheduler round.
pub fn trim_cached() {
    let Some(bound) = device::buffer_cache_bound() else { return };
    let held = mlx_rs::memory::cache_memory().unwrap_or(0) as u64;
    let Some(target) = cache_trim_target(held, bound) else { return };
    // MLX brings its cache down to the limit at the next allocation, oldest buffers first.
    let _ = mlx_rs::memory::set_cache_limit(target as usize);
    let _ = mlx_rs::Array::from_slice(&[0u8], &[1]).eval();
    let _ = mlx_rs::memory::set_cache_limit(bound as usize);
}

/// What [`trim_cached`] brings a cache holding `held` bytes under a `bound` down to, if anything.
pub fn cache_trim_target(held: u64, bound: u64) -> Option<u64> {
    (held > bound / 2).then_some(bound / 4)
}

/// Bytes the device that runs the model can give now: `SALA_AVAILABLE_MEMORY` if set; on a CUDA
/// GPU its own memory less what MLX holds; on Metal the GPU's recommended working set less what
/// MLX holds, capped by the free unified memory; on the CPU the free host memory. `None` when
/// unknown (the check is then skipped).
pub fn available_bytes(device: DeviceKind) -> Option<u64> {
    if let Some(v) = std::env::var("SALA_AVAILABLE_MEMORY").ok().and_then(|v| v.trim().parse().ok()) {
        return Some(v);
    }
    let held = || mlx_rs::memory::active_memory().unwrap_or(0) as u64;
    match (device, device::gpu_backend()) {
        (DeviceKind::Gpu, Some("cuda")) => total_bytes(device).map(|total| total.saturating_sub(held())),
        (DeviceKind::Gpu, Some(_)) => {
            let working_set = device::gpu_info().and_then(|g| g.working_set_bytes).map(|w| w.saturating_sub(held()));
            match (working_set, host_available_bytes()) {
                (Some(gpu), Some(host)) => Some(gpu.min(host)),
                (gpu, host) => gpu.or(host),
            }
        }
        _ => host_available_bytes(),
    }
}

/// All the memory the device that runs the model has: a CUDA GPU's own, else the host's (unified
/// on Metal). `None` where unknown.
pub fn total_bytes(device: DeviceKind) -> Option<u64> {
    match (device, device::gpu_backend()) {
        (DeviceKind::Gpu, Some("cuda")) => device::gpu_info()?.memory_bytes,
        _ => host_total_bytes(),
    }
}

/// Free host memory (what the OS could hand out without swapping), `None` where unknown.
pub fn host_available_bytes() -> Option<u64> {
    let system = host_memory();
    Some(system.available_memory()).filter(|&b| b > 0)
}

/// Total host memory, `None` where unknown.
pub fn host_total_bytes() -> Option<u64> {
    Some(host_memory().total_memory()).filter(|&b| b > 0)
}

fn host_memory() -> sysinfo::System {
    sysinfo::System::new_with_specifics(sysinfo::RefreshKind::nothing().with_memory(sysinfo::MemoryRefreshKind::nothing().with_ram()))
}

/// Bytes free now for states kept beside the loaded model, on the device it runs on.
pub fn free_for_states() -> Option<u64> {
    available_bytes(if device::on_cpu() { DeviceKind::Cpu } else { DeviceKind::Gpu })
}

/// The default budget of kept prompt states (`sala serve --cache-memory`): a quarter of the
/// memory free once the model is loaded, 4 GiB where that is unknown.
pub fn default_state_budget() -> u64 {
    free_for_states().map_or(4 << 30, |free| free / 4)
}

/// Bytes of the weights once loaded in `dtype` (float tensors cast, quantized codes as stored).
pub fn weights_bytes(source: &ModelSource, dtype: Dtype) -> u64 {
    weights_bytes_per_rank(source, dtype, 1)
}

/// [`weights_bytes`] on each of `ranks` tensor-parallel ranks: the layers' matrices are split
/// between them; embeddings, the output head and vectors are whole on every rank.
pub fn weights_bytes_per_rank(source: &ModelSource, dtype: Dtype, ranks: usize) -> u64 {
    let size = dtype_bytes(dtype) as u64;
    source
        .weights
        .infos()
        .iter()
        .map(|(name, info)| {
            // Quantized matrices' scales and biases are cast to `dtype` like other float tensors
            // (QuantizedMatrix::for_device); their packed codes stay as stored.
            let bytes = if float_dtype(&info.dtype).is_some() { info.numel() as u64 * size } else { info.nbytes() };
            let split = name.starts_with("model.layers.") && info.shape.len() == 2;
            if split {
                bytes / ranks as u64
            } else {
                bytes
            }
        })
        .sum()
}

pub fn dtype_bytes(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Float32 => 4,
        _ => 2,
    }
}

/// `1.23 GB` or `45.6 MB`.
pub fn human(bytes: u64) -> String {
    if bytes >= 1_000_000_000 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

/// What running a model over one sequence needs on one device.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    pub weights: u64,
    /// The sequence's cache once it holds `tokens` tokens.
    pub cache: u64,
    /// The working memory of its last prompt step (`prefill_step` tokens).
    pub prompt_step: u64,
    pub tokens: usize,
    pub prefill_step: usize,
}

impl Needs {
    pub fn total(&self) -> u64 {
        self.weights.saturating_add(self.cache).saturating_add(self.prompt_step)
    }
}

/// Refuses when `needs` exceeds the available memory, naming each part and what to change.
pub fn check_fits(what: &str, needs: &Needs, device: DeviceKind) -> Result<()> {
    let Some(available) = available_bytes(device) else { return Ok(()) };
    if needs.total() > available {
        return Err(Error::Usage(format!(
            "{what} needs {} (weights {} + cache {} for {} tokens + {} for prompt steps of {} tokens) but only {} \
             is available on the {}; use a smaller context (--max-tokens, a shorter prompt), smaller prompt steps \
             (--prefill-step), a quantized model (`sala quantize`) or a machine with more memory",
            human(needs.total()),
            human(needs.weights),
            human(needs.cache),
            needs.tokens,
            human(needs.prompt_step),
            needs.prefill_step,
            human(available),
            device::describe(device)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_known_and_agrees_with_the_kernel() {
        let (free, total) = (host_available_bytes().expect("free memory"), host_total_bytes().expect("total memory"));
        assert!(free > 0 && free <= total, "free {free} of {total}");
        #[cfg(target_os = "linux")]
        {
            let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
            let kb = |key: &str| -> u64 {
                let line = meminfo.lines().find(|l| l.starts_with(key)).unwrap();
                line.split_whitespace().nth(1).unwrap().parse().unwrap()
            };
            assert_eq!(total, kb("MemTotal:") * 1024);
            // Free memory moves while the test runs; the two reads agree within 5 %.
            let kernel = kb("MemAvailable:") * 1024;
            assert!(free.abs_diff(kernel) < kernel / 20, "sysinfo {free}, /proc/meminfo {kernel}");
        }
    }

    #[test]
    fn the_buffer_cache_is_trimmed_to_a_quarter_once_past_half_its_bound() {
        let gib = 1u64 << 30;
        assert_eq!(cache_trim_target(0, 14 * gib), None);
        assert_eq!(cache_trim_target(7 * gib, 14 * gib), None);
        assert_eq!(cache_trim_target(7 * gib + 1, 14 * gib), Some(14 * gib / 4));
        assert_eq!(cache_trim_target(14 * gib, 14 * gib), Some(14 * gib / 4));
    }

    #[test]
    fn each_device_reports_the_memory_it_uses() {
        if let Some(set) = std::env::var("SALA_AVAILABLE_MEMORY").ok().and_then(|v| v.trim().parse::<u64>().ok()) {
            // The user's figure stands for every device.
            assert_eq!([DeviceKind::Cpu, DeviceKind::Gpu].map(available_bytes), [Some(set); 2]);
            return;
        }
        assert_eq!(total_bytes(DeviceKind::Cpu), host_total_bytes());
        let host = host_available_bytes().unwrap();
        let near = |a: u64, b: u64| a.abs_diff(b) < b / 20;
        assert!(near(available_bytes(DeviceKind::Cpu).unwrap(), host));
        let gpu = available_bytes(DeviceKind::Gpu).unwrap();
        match device::gpu_backend() {
            // No GPU of its own: a GPU request is run on the host's memory.
            None => assert!(near(gpu, host), "{gpu} vs host {host}"),
            // CUDA: the card's memory, whatever the host has.
            Some("cuda") => assert!(gpu <= total_bytes(DeviceKind::Gpu).unwrap()),
            // Metal: unified memory, at most what the host has free.
            Some(_) => assert!(gpu <= host + host / 20, "{gpu} vs host {host}"),
        }
    }
}
