//! Will it fit? Memory a model needs (weights in the compute dtype + one sequence's cache) against
//! what the machine has, checked before loading and before prefill so an oversized request is
//! refused with the numbers instead of crashing the machine.

use crate::engine::error::{Error, Result};
use crate::engine::source::ModelSource;
use crate::engine::weights::float_dtype;
use mlx_rs::Dtype;

/// Bytes the machine can give us now: `SALA_AVAILABLE_MEMORY` if set, else the kernel's
/// `MemAvailable` (Linux). `None` when unknown (the check is then skipped).
pub fn available_bytes() -> Option<u64> {
    if let Some(v) = std::env::var("SALA_AVAILABLE_MEMORY").ok().and_then(|v| v.trim().parse().ok()) {
        return Some(v);
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes free now for states kept beside the loaded model: on a CUDA GPU (memory of its own) its
/// memory less what MLX holds, otherwise [`available_bytes`].
pub fn free_for_states() -> Option<u64> {
    use crate::engine::device;
    if !device::on_cpu() && device::gpu_backend() == Some("cuda") && std::env::var_os("SALA_AVAILABLE_MEMORY").is_none() {
        if let Some(total) = device::gpu_info().and_then(|g| g.memory_bytes) {
            return Some(total.saturating_sub(mlx_rs::memory::active_memory().unwrap_or(0) as u64));
        }
    }
    available_bytes()
}

/// The default budget of kept prompt states (`sala serve --cache-memory`): a quarter of the
/// memory free once the model is loaded, 4 GiB where that is unknown.
pub fn default_state_budget() -> u64 {
    free_for_states().map_or(4 << 30, |free| free / 4)
}

/// Bytes of the weights once loaded in `dtype` (float tensors cast, quantized ones as stored).
pub fn weights_bytes(source: &ModelSource, dtype: Dtype) -> u64 {
    let size = dtype_bytes(dtype) as u64;
    source
        .weights
        .infos()
        .iter()
        .map(|(name, info)| {
            let quant_part = name.ends_with(".scales") || name.ends_with(".biases");
            if float_dtype(&info.dtype).is_some() && !quant_part {
                info.numel() as u64 * size
            } else {
                info.nbytes()
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

/// Refuses when `weights + cache` exceeds the available memory, naming all three numbers.
pub fn check_fits(what: &str, weights: u64, cache: u64, context: usize) -> Result<()> {
    let Some(available) = available_bytes() else { return Ok(()) };
    if weights + cache > available {
        return Err(Error::Usage(format!(
            "{what} needs {} (weights {} + cache {} for {context} tokens) but only {} is available; \
             use a smaller context (--max-tokens, a shorter prompt), a quantized model (`sala quantize`) \
             or a machine with more memory",
            human(weights + cache),
            human(weights),
            human(cache),
            human(available)
        )));
    }
    Ok(())
}
