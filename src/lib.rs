//! `sala`: MiniCPM-SALA (and friends) on MLX.

pub mod cli;
pub mod engine;
pub mod eval;
pub mod kernels;
pub mod launch;
pub mod load;
pub mod models;
pub mod progress;
pub mod server;
pub mod store;
