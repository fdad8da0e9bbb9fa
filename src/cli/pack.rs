//! `sala pack`: one file holding a whole model (weights, config, tokenizer, chat template), and
//! back again.

use crate::models;
use crate::store::pack;
use anyhow::{bail, Context};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala pack --model ./MiniCPM-SALA-8bit --output sala-8bit.sala\n  sala pack --model SmolLM2.gguf --output smollm2.sala\n  sala pack --info sala-8bit.sala\n  sala pack --extract sala-8bit.sala --output ./MiniCPM-SALA-8bit")]
pub struct PackArgs {
    /// Model to pack: a directory, or a .gguf file (converted)
    #[arg(long, short = 'm', conflicts_with_all = ["extract", "info"], required_unless_present_any = ["extract", "info"])]
    pub model: Option<PathBuf>,
    /// Restore the directory a .sala file was made from (into --output)
    #[arg(long, value_name = "FILE", conflicts_with = "info")]
    pub extract: Option<PathBuf>,
    /// Print what a .sala file holds (same as `sala show FILE`)
    #[arg(long, value_name = "FILE")]
    pub info: Option<PathBuf>,
    /// The .sala file to write, or the directory to extract into (must not exist)
    #[arg(long, short = 'o', required_unless_present = "info")]
    pub output: Option<PathBuf>,
}

pub fn run(args: PackArgs) -> anyhow::Result<()> {
    if let Some(file) = args.info {
        return crate::cli::show::run(crate::cli::show::ShowArgs { model: file, context: None, tensors: false, json: false });
    }
    let output = args.output.expect("clap requires --output");
    let bar = crate::progress::bytes_progress("packing", 0);
    if let Some(file) = args.extract {
        let total = std::fs::metadata(&file).with_context(|| format!("{}", file.display()))?.len();
        bar.set_length(total);
        let dir = pack::extract(&file, &output, &|n| bar.inc(n))?;
        bar.finish_and_clear();
        eprintln!("extracted {} into {}", file.display(), dir.display());
        return Ok(());
    }
    let Some(model) = args.model else { bail!("pass --model DIR to pack, or --extract FILE") };
    let mut source = crate::load::open(&model)?;
    let cfg = source.config()?;
    models::check(&cfg, &mut source.weights)?;
    bar.set_length(source.weights.infos().values().map(|i| i.nbytes()).sum());
    pack::pack(&source, &output, &|n| bar.inc(n))?;
    bar.finish_and_clear();
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    eprintln!("wrote {} ({})", output.display(), crate::engine::memory::human(size));
    Ok(())
}
