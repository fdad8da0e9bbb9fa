//! Compute kernels behind one function each. On a GPU a function runs its kernel (CUDA source in
//! `cuda/`, the Metal twin in `metal/`, compiled at run time by MLX, see [`custom`]); on the CPU,
//! and as the kernels' test oracle, it runs the same computation in MLX ops (`*_mlx`, or the
//! named reference form). InfLLM-V2's MLX-ops forms are model math and live in
//! `models::sala::infllm`, which also picks between them and [`sparse`]'s kernels.
//! (docs/architecture.md, Kernels; docs/adding-a-kernel.md.)

pub mod custom;
pub mod gla;
pub mod kv;
pub mod lightning;
pub mod qmv;
pub mod sparse;
