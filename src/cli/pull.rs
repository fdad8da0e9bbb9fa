//! `sala pull`: download a model into the store (the HuggingFace cache).

use crate::store::cache::ModelRef;
use crate::engine::memory::human;
use crate::store::pull::{pull, DEFAULT_REPO};
use clap::Args;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala pull                                   # moxin-org/MiniCPM4-SALA-9B-8bit-mlx\n  sala pull HuggingFaceTB/SmolLM2-135M-Instruct --revision main\n  HF_ENDPOINT=https://hf-mirror.com sala pull org/name\n\nEnvironment: HF_ENDPOINT (mirror), HF_TOKEN, HF_HUB_CACHE / HF_HOME (store), HF_HUB_OFFLINE,\nHF_HUB_DOWNLOAD_TIMEOUT (seconds a connection may stay silent, or bring under 16 KiB, before it is retried; 10)")]
pub struct PullArgs {
    /// Repository id (org/name)
    #[arg(default_value = DEFAULT_REPO)]
    pub repo: String,
    /// Branch, tag or commit
    #[arg(long, default_value = "main")]
    pub revision: String,
}

pub fn run(args: PullArgs) -> anyhow::Result<()> {
    let reference = ModelRef::parse(&format!("{}@{}", args.repo, args.revision))?;
    let pulled = pull(&reference, &crate::progress::bar_set(), Default::default())?;
    // A file the hub gave no size or sha256 for could not be checked: say so, not "verified".
    let checked = match pulled.unchecked {
        0 => "all verified".to_string(),
        n => format!("{n} with no size or sha256 from the hub to check, the rest verified"),
    };
    eprintln!(
        "{}@{}: {} files, {} ({} already here, {checked}) in {}",
        reference.repo,
        reference.revision,
        pulled.files,
        human(pulled.bytes),
        pulled.reused,
        pulled.snapshot.display()
    );
    Ok(())
}
