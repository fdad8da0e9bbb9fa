//! `sala quantize`: write an MLX-quantized copy of a model, optionally measuring what it changed.

use crate::cli::DtypeArg;
use crate::engine::quant::{quantize_checkpoint, QuantFormat, QuantizeRequest};
use crate::eval::quant_report;
use crate::load::{load, open, LoadOptions};
use crate::models;
use crate::engine::memory::human;
use anyhow::bail;
use clap::Args;
use mlx_rs::Dtype;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala quantize --model ./MiniCPM-SALA --bits 8 --output ./MiniCPM-SALA-8bit\n  sala quantize -m SmolLM2.gguf --bits 4 -o ./smollm2-4bit --report --csv report.csv")]
pub struct QuantizeArgs {
    /// Source model: a directory, a .sala file or a .gguf file (never modified)
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Bits per weight
    #[arg(long, value_parser = clap::value_parser!(i32).range(2..=8))]
    pub bits: i32,
    /// Weights sharing one scale and bias (32, 64 or 128)
    #[arg(long, default_value_t = 64)]
    pub group_size: i32,
    /// Output directory (must not exist; written beside it, then renamed into place)
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Quantize the token embeddings too
    #[arg(long)]
    pub quantize_embeddings: bool,
    /// Dtype of scales, biases and unquantized tensors (default: the source's)
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Afterwards, run fixed prompts through both models and print per-layer errors, logit KL
    /// divergence and top-1 agreement
    #[arg(long)]
    pub report: bool,
    /// Also write the report as CSV
    #[arg(long, requires = "report")]
    pub csv: Option<PathBuf>,
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let format = QuantFormat { group_size: args.group_size, bits: args.bits }
        .validate()
        .map_err(|m| anyhow::anyhow!("--bits/--group-size: {m}"))?;
    let mut source = open(&args.model)?;
    let cfg = source.config()?;
    models::check(&cfg, &mut source.weights)?;
    let dtype = args.dtype.map(DtypeArg::dtype).or_else(|| source.weights.storage_dtype()).unwrap_or(Dtype::Bfloat16);
    if !matches!(dtype, Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16) {
        bail!("cannot keep float tensors in {dtype:?}");
    }
    let request = QuantizeRequest { format, quantize_embeddings: args.quantize_embeddings, dtype };
    let total: u64 = source.weights.infos().values().map(|i| i.nbytes()).sum();
    let bar = crate::progress::bytes_progress("quantizing", total);
    let started = std::time::Instant::now();
    let out = quantize_checkpoint(&source, &request, &args.output, &|bytes| bar.inc(bytes))?;
    bar.finish_and_clear();
    let size = crate::store::cache::dir_size(&out);
    eprintln!(
        "wrote {} ({} bits, group size {}, {}, source {}) in {:.1} s",
        out.display(),
        format.bits,
        format.group_size,
        human(size),
        human(total),
        started.elapsed().as_secs_f64()
    );
    if args.report {
        drop(source);
        report(&args, dtype)?;
    }
    Ok(())
}

/// Runs the fixed prompts through the source, then through the result, and prints the comparison.
fn report(args: &QuantizeArgs, dtype: Dtype) -> anyhow::Result<()> {
    let options = |path: &PathBuf| LoadOptions { dtype: Some(dtype), ..LoadOptions::at(path) };
    let source = load(&options(&args.model), 0)?;
    let prompts = quant_report::prompts(source.tokenizer.as_ref(), source.model.info().vocab_size)?;
    let context = prompts.iter().map(Vec::len).max().unwrap_or(0);
    source.check_fits(context)?;
    let reference = quant_report::run(source.model.as_ref(), &prompts)?;
    drop(source);
    let quantized = load(&options(&args.output), context)?;
    let comparison = quant_report::compare(&reference, &quant_report::run(quantized.model.as_ref(), &prompts)?);
    let report = comparison.report();
    println!("{}", report.table());
    println!(
        "{} prompts, {} positions: logits KL mean {:.5} nats, top-1 agreement {:.2}%",
        prompts.len(),
        comparison.positions,
        comparison.kl_mean,
        100.0 * comparison.top1_agreement
    );
    if let Some(path) = &args.csv {
        report.write_csv(path)?;
    }
    Ok(())
}
