//! Command-line interface: one module per subcommand.

pub mod quantize;
pub mod run;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sala", version, about = "Run MiniCPM-SALA and other LLMs locally on MLX")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate text from a prompt and stream it to stdout
    Run(run::RunArgs),
    /// Write an MLX-quantized (8/4-bit) copy of a model
    Quantize(quantize::QuantizeArgs),
}

pub fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run::run(args),
        Command::Quantize(args) => quantize::run(args),
    }
}
