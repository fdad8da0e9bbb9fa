//! Command-line interface: one module per subcommand.

pub mod list;
pub mod pack;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod show;

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
    /// Pack a model into one .sala file (weights, config, tokenizer, template), or extract one
    Pack(pack::PackArgs),
    /// Show what a model is: architecture, parameters, quantization, files, memory needed
    Show(show::ShowArgs),
    /// Download a model into the store (the HuggingFace cache), verified
    Pull(pull::PullArgs),
    /// List the models in the store (the HuggingFace cache)
    List(list::ListArgs),
    /// Delete a model from the store
    Rm(list::RmArgs),
}

pub fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Show(args) => show::run(args),
        Command::Pull(args) => pull::run(args),
        Command::List(args) => list::list(args),
        Command::Rm(args) => list::rm(args),
    }
}

/// A byte-counting progress bar on stderr (hidden when stderr is not a terminal).
pub fn bytes_progress(label: &str, total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    let bar = indicatif::ProgressBar::new(total);
    if std::io::stderr().is_terminal() {
        let template = format!("{label} {{bar:40}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, eta {{eta}})");
        bar.set_style(indicatif::ProgressStyle::with_template(&template).expect("valid template"));
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}
