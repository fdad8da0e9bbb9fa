//! Compute kernels behind one function each. These are the MLX-ops implementations, used on the
//! CPU and as the reference for device-specific versions.

pub mod gla;
pub mod sparse;
