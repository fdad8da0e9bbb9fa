//! Marks on the device's timeline for `sala bench --profile`: the GPU's clock read by a
//! one-thread kernel (`cuda/stamp.cu`) once the work it follows is done. A clock has no MLX-ops
//! version: elsewhere than on CUDA there is no mark (Metal's shaders cannot read a clock).

use super::custom::{apply, backend, Backend, KernelSource, Launch};
use mlx_rs::{error::Result, Array, Dtype};

static STAMP: KernelSource = KernelSource {
    name: "sala_stamp",
    inputs: &["after"],
    outputs: &["at"],
    cuda_header: include_str!("../../cuda/stamp.cu"),
    cuda_body: "sala_stamp(at);",
    metal_header: "",
    metal_body: "",
    // `after` orders the launch and is never read: no copy of it.
    contiguous_inputs: false,
    shared_memory: 0,
};

/// The GPU's clock in nanoseconds (`[1]` uint64) once `after` is computed, on CUDA; `None`
/// elsewhere.
pub fn stamp(after: &Array) -> Result<Option<Array>> {
    if backend() != Backend::Cuda {
        return Ok(None);
    }
    let launch = Launch { grid: (1, 1, 1), threads: (1, 1, 1), outputs: vec![(vec![1], Dtype::Uint64)], template: vec![], init: None };
    Ok(apply(&STAMP, &[after], launch)?.into_iter().next())
}
