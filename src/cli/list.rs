//! `sala list` and `sala rm`: the models in the store (the HuggingFace hub cache).

use crate::eval::report::Report;
use crate::store::cache::{self, cache_dir};
use crate::engine::memory::human;
use crate::store::summary::summarize;
use clap::Args;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala list\n  HF_HUB_CACHE=/data/hub sala list")]
pub struct ListArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
#[command(after_help = "Example:\n  sala rm moxin-org/MiniCPM4-SALA-9B-8bit-mlx")]
pub struct RmArgs {
    /// The model to delete, as `sala list` names it (org/name)
    pub name: String,
}

pub fn list(args: ListArgs) -> anyhow::Result<()> {
    let store = cache_dir();
    let models = cache::list(&store)?;
    let mut report = Report::new(&["name", "size", "quantization", "architecture", "context"]);
    let mut json = Vec::new();
    for m in &models {
        // A snapshot that is not a runnable model is listed, not fatal (a half-downloaded one is
        // not listed at all: it has no ref yet).
        let (quantization, architecture, context) = match summarize(&m.snapshot, None) {
            Ok((s, _)) => (s.quantization, s.model_type, s.context_length.map_or("?".into(), |c| c.to_string())),
            Err(e) => ("?".into(), format!("unreadable: {e}"), "?".into()),
        };
        json.push(serde_json::json!({
            "name": m.name, "path": m.snapshot, "size": m.size, "quantization": quantization,
            "architecture": architecture, "context": context,
        }));
        report.push(vec![m.name.clone(), human(m.size), quantization, architecture, context]);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else if models.is_empty() {
        println!("no models in {} (fetch one with `sala pull`)", store.display());
    } else {
        println!("{}", report.table());
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let freed = cache::remove(&cache_dir(), &args.name)?;
    eprintln!("deleted {} ({} freed)", args.name, human(freed));
    Ok(())
}
