//! `sala show`: what a model is (architecture, size, quantization, files), optionally every tensor.

use crate::engine::memory::human;
use crate::store::summary::summarize;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala show ./MiniCPM-SALA-8bit\n  sala show model.sala --tensors\n  sala show SmolLM2.gguf --json\n  sala show moxin-org/MiniCPM4-SALA-9B-8bit-mlx --context 131072")]
pub struct ShowArgs {
    /// A model directory, .sala file, .gguf file, or a name from `sala list`
    pub model: PathBuf,
    /// Estimate memory for this many tokens of context (default: the model's, at most 4096)
    #[arg(long)]
    pub context: Option<usize>,
    /// Also list every tensor the file stores, with its dtype (GGUF: its type) and shape
    #[arg(long)]
    pub tensors: bool,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ShowArgs) -> anyhow::Result<()> {
    let (s, _) = summarize(&args.model, args.context)?;
    if args.json {
        let mut value = serde_json::to_value(&s)?;
        if args.tensors {
            let tensors: serde_json::Map<String, serde_json::Value> =
                s.stored.iter().map(|t| (t.name.clone(), serde_json::json!({"dtype": t.dtype, "shape": t.shape}))).collect();
            value["tensor_list"] = tensors.into();
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    println!("model        {}", s.path);
    println!("layout       {}", s.layout);
    println!("architecture {}", s.model_type);
    println!("parameters   {:.1} M", s.parameters as f64 / 1e6);
    println!("layers       {}   hidden {}   vocab {}   context {}", opt(s.layers), opt(s.hidden_size), opt(s.vocab_size), opt(s.context_length));
    // One line per source, as the file left the keys out.
    let mut sources: Vec<&str> = s.config_defaults.iter().map(|d| d.source).collect();
    sources.dedup();
    for (i, source) in sources.iter().enumerate() {
        let label = if i == 0 { "defaults" } else { "" };
        let keys: Vec<String> = s.config_defaults.iter().filter(|d| d.source == *source).map(|d| format!("{} = {}", d.key, d.value)).collect();
        println!("{label:<12} {} (not in {}; from {source})", keys.join(", "), s.config_source);
    }
    let ids = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    match s.generation.eos_token_ids.is_empty() {
        true => println!("stops at     {} ({})", ids(&s.config_eos_token_ids), s.config_source),
        false => println!("stops at     {} ({}), {} (generation_config.json)", ids(&s.config_eos_token_ids), s.config_source, ids(&s.generation.eos_token_ids)),
    }
    let (set, unset): (Vec<_>, Vec<_>) = s.generation.sampling.describe().into_iter().partition(|(_, v)| v.is_some());
    let set: Vec<String> = set.into_iter().map(|(k, v)| format!("{k} {}", v.unwrap_or_default())).collect();
    let unset: Vec<&str> = unset.into_iter().map(|(k, _)| k).collect();
    match (set.is_empty(), unset.is_empty()) {
        (true, _) => println!("sampling     sala's defaults (no generation_config.json settings); flags and request fields override"),
        (false, true) => println!("sampling     {} (generation_config.json); flags and request fields override", set.join(", ")),
        (false, false) => println!(
            "sampling     {} (generation_config.json); {}: sala's defaults; flags and request fields override",
            set.join(", "),
            unset.join(", ")
        ),
    }
    println!("quantization {}", s.quantization);
    let dtypes: Vec<String> = s.dtypes.iter().map(|(d, n)| format!("{d} ×{n}")).collect();
    // A synthetic model's tensors are drawn when it is loaded, not read from a file.
    let held_in = if s.layout.starts_with("synthetic") { "drawn at load" } else { "in the file" };
    println!("tensors      {} {held_in} ({})", s.tensors, dtypes.join(", "));
    for (i, t) in s.gguf_types.iter().enumerate() {
        let label = if i == 0 { "gguf types" } else { "" };
        println!("{label:<12} {} ×{}: {}", t.ggml_type, t.tensors, t.stored);
    }
    if let Some(first) = s.skipped_buffers.first() {
        let more = s.skipped_buffers.len() - 1;
        let rest = if more > 0 { format!(" and {more} more") } else { String::new() };
        println!("skipped      {} buffer(s) not loaded (rotary tables the model derives itself): {first}{rest}", s.skipped_buffers.len());
    }
    println!("size         {:.1} MB on disk", s.disk_bytes as f64 / 1e6);
    println!("config       {}", s.config_source);
    println!("tokenizer    {}", s.tokenizer_source.as_deref().unwrap_or("none"));
    println!("template     {}", s.chat_template_source.as_deref().unwrap_or("none"));
    println!("files        {}", s.files.join(", "));
    let m = &s.memory;
    println!(
        "memory       {} at {} tokens on the {}: weights {} + cache {}",
        human(m.weights_bytes + m.cache_bytes),
        m.context,
        m.device,
        human(m.weights_bytes),
        human(m.cache_bytes)
    );
    println!("held as      {}", m.held);
    if args.tensors {
        for t in &s.stored {
            println!("  {:<60} {:<5} {:?}", t.name, t.dtype, t.shape);
        }
    }
    Ok(())
}
