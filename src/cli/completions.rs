//! `sala completions SHELL`: the shell completion script, generated from the command-line
//! definition (the files in `completions/` are the same scripts, checked by tests/cli_docs.rs).

use clap::{Args, CommandFactory};
use clap_complete::Shell;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala completions bash > ~/.local/share/bash-completion/completions/sala\n  sala completions zsh > ~/.zfunc/_sala        # with fpath+=(~/.zfunc) before compinit\n  sala completions fish > ~/.config/fish/completions/sala.fish\n  sala completions powershell >> $PROFILE")]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The completion script for `shell`.
pub fn script(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut super::Cli::command(), "sala", &mut out);
    out
}

pub fn run(args: CompletionsArgs) -> anyhow::Result<()> {
    use std::io::Write;
    std::io::stdout().write_all(&script(args.shell))?;
    Ok(())
}
