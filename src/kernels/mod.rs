//! Compute kernels behind one function each. On a GPU a function runs its kernel (CUDA source in
//! `cuda/`, the Metal twin in `metal/`, compiled at run time by MLX, see [`custom`]); on the CPU,
//! and as the kernels' test oracle, it runs the same computation in MLX ops (`*_mlx`, or the
//! named reference form). InfLLM-V2's MLX-ops forms are model math and live in
//! `models::sala::infllm`, which also picks between them and [`sparse`]'s kernels.
//! (docs/architecture.md, Kernels; docs/adding-a-kernel.md.)

pub mod all_reduce;
pub mod custom;
pub mod dequantize;
pub mod draw;
pub mod epilogue;
pub mod fp8;
pub mod gla;
pub mod kv;
pub mod lightning;
pub mod module_cache;
pub mod qmm_i8;
pub mod qmv;
pub mod rope;
pub mod selfcheck;
pub mod sparse;
pub mod stamp;

/// The self-checks of the kernels whose MLX-ops versions are here (InfLLM-V2's are in
/// `models::sala::infllm`; `models::kernel_checks` lists all).
pub static KERNEL_CHECKS: [&selfcheck::KernelCheck; 17] = [
    &dequantize::DEQUANTIZE_CHECK,
    &draw::DRAW_CHECK,
    &epilogue::EPILOGUE_CHECK,
    &fp8::FP8_CHECK,
    &gla::GLA_DECODE_CHECK,
    &gla::GLA_PREFILL_CHECK,
    &lightning::DECODE_STEP_CHECK,
    &lightning::NORM_GATE_CHECK,
    &kv::APPEND_CHECK,
    &qmv::QMV_CHECK,
    &qmv::QMM_CHECK,
    &qmv::QMV_NORMED_CHECK,
    &sparse::DECODE_ATTENTION_CHECK,
    &sparse::DECODE_ATTENTION_MMA_CHECK,
    &sparse::DECODE_ATTENTION_Q8_CHECK,
    &rope::ROPE_APPEND_CHECK,
    &rope::ROPE_PROMPT_CHECK,
];
