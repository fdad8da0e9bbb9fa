//! Compute kernels behind one function each. On a GPU a function runs its kernel (CUDA source in
//! `cuda/`, the Metal twin in `metal/`, compiled at run time by MLX, see [`custom`]); on the CPU,
//! and as the kernels' test oracle, it runs the same computation in MLX ops (`*_mlx`, or the
//! named reference form).

pub mod custom;
pub mod gla;
pub mod kv;
pub mod lightning;
pub mod qmv;
pub mod sparse;
