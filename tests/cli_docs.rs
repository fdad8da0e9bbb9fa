//! The command line's documentation: completions/ and man/ are generated from the clap
//! definition and must match it (`SALA_UPDATE_GENERATED=1 cargo test --test cli_docs` rewrites
//! them); every command and flag is described and every command has an example; typos get
//! suggestions.

use clap::CommandFactory;
use clap_complete::{Generator, Shell};
use sala::cli::Cli;
use std::path::{Path, PathBuf};
use std::process::Command;

const SHELLS: [Shell; 5] = [Shell::Bash, Shell::Zsh, Shell::Fish, Shell::Elvish, Shell::PowerShell];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn updating() -> bool {
    std::env::var("SALA_UPDATE_GENERATED").is_ok_and(|v| v == "1")
}

/// `sala.1` and `sala-COMMAND.1` for every command, rendered by clap_mangen.
fn man_pages() -> Vec<(String, Vec<u8>)> {
    let mut cli = Cli::command();
    cli.build();
    let render = |cmd: clap::Command| {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page).unwrap();
        page
    };
    let mut pages = vec![("sala.1".to_string(), render(cli.clone()))];
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("sala-{}", sub.get_name());
        let page = sub.clone().name(name.clone()).bin_name(format!("sala {}", sub.get_name()));
        pages.push((format!("{name}.1"), render(page)));
    }
    pages
}

/// Compares `expected` files with the folder's contents (no file missing, stale or extra), or
/// writes them when updating.
fn check_folder(dir: &Path, expected: &[(String, Vec<u8>)]) {
    if updating() {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        for (name, bytes) in expected {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        return;
    }
    let mut present: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}; generate it with SALA_UPDATE_GENERATED=1 cargo test --test cli_docs", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    present.sort();
    let mut names: Vec<String> = expected.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(present, names, "{}: files differ from the generated set; regenerate with SALA_UPDATE_GENERATED=1 cargo test --test cli_docs", dir.display());
    for (name, bytes) in expected {
        let committed = std::fs::read(dir.join(name)).unwrap();
        assert!(
            &committed == bytes,
            "{}/{name} is stale: the command line changed; regenerate with SALA_UPDATE_GENERATED=1 cargo test --test cli_docs",
            dir.display()
        );
    }
}

#[test]
fn completions_match_the_command_line() {
    let scripts: Vec<(String, Vec<u8>)> =
        SHELLS.iter().map(|&s| (s.file_name("sala"), sala::cli::completions::script(s))).collect();
    // Every shell's script names every command.
    for (name, script) in &scripts {
        let text = String::from_utf8_lossy(script);
        for command in ["run", "chat", "serve", "quantize", "pull", "bench", "needle", "bfcl", "doctor", "completions"] {
            assert!(text.contains(command), "{name} does not complete `{command}`");
        }
    }
    check_folder(&root().join("completions"), &scripts);
}

#[test]
fn man_pages_match_the_command_line() {
    let pages = man_pages();
    let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
    for page in ["sala.1", "sala-run.1", "sala-chat.1", "sala-serve.1", "sala-bench.1", "sala-doctor.1", "sala-completions.1"] {
        assert!(names.contains(&page), "no {page} among {names:?}");
    }
    let run = String::from_utf8_lossy(&pages.iter().find(|(n, _)| n == "sala-run.1").unwrap().1).to_string();
    assert!(run.contains("temperature") && run.contains("sala run"), "sala-run.1 lacks the run options:\n{run}");
    check_folder(&root().join("man"), &pages);
}

#[test]
fn sala_completions_prints_the_generated_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let parsed: Shell = shell.parse().unwrap();
        assert_eq!(out.stdout, sala::cli::completions::script(parsed), "{shell}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'tcsh'") && err.contains("bash"), "{err}");
}

#[test]
fn every_command_and_flag_has_a_description_and_every_command_an_example() {
    let mut cli = Cli::command();
    cli.build();
    let mut missing = Vec::new();
    for cmd in std::iter::once(&cli).chain(cli.get_subcommands().filter(|s| s.get_name() != "help")) {
        let name = if cmd.get_name() == "sala" { "sala".to_string() } else { format!("sala {}", cmd.get_name()) };
        match cmd.get_about() {
            Some(about) if !about.to_string().trim().is_empty() && !about.to_string().contains('\n') => {}
            _ => missing.push(format!("{name}: no one-line description")),
        }
        let after = cmd.get_after_help().map(|h| h.to_string()).unwrap_or_default();
        if !after.contains("Example") || !after.contains(&format!("{name} ")) && !after.contains(&format!("{name}\n")) {
            missing.push(format!("{name}: no example in --help"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") || arg.is_hide_set() {
                continue;
            }
            match arg.get_help() {
                Some(help) if !help.to_string().trim().is_empty() => {}
                _ => missing.push(format!("{name}: --{id} has no description")),
            }
        }
    }
    assert!(missing.is_empty(), "undocumented:\n{}", missing.join("\n"));
}

/// `--help` of every command keeps each flag's description on its line, as clap lays help out
/// unless a flag has a multi-paragraph description or documented values (which moved
/// `sala bfcl --help` to a long layout of its own).
#[test]
fn every_command_help_has_one_layout() {
    let mut cli = Cli::command();
    cli.build();
    let mut long = Vec::new();
    for cmd in std::iter::once(&cli).chain(cli.get_subcommands().filter(|s| s.get_name() != "help")) {
        let args: Vec<&str> = if cmd.get_name() == "sala" { vec!["--help"] } else { vec![cmd.get_name(), "--help"] };
        let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(&args).output().unwrap();
        assert!(out.status.success(), "sala {args:?}");
        let help = String::from_utf8(out.stdout).unwrap();
        let flags: Vec<&str> = help.lines().filter(|l| l.trim_start().starts_with('-')).collect();
        assert!(!flags.is_empty() || cmd.get_name() == "sala", "{}: no flags in its help", cmd.get_name());
        // A flag line with no gap before a description is the long layout's.
        if let Some(line) = flags.iter().find(|l| !l.trim().contains("  ")) {
            long.push(format!("{}: `{}`", cmd.get_name(), line.trim()));
        }
    }
    assert!(long.is_empty(), "commands whose --help puts descriptions on their own lines:\n{}", long.join("\n"));
}

#[test]
fn typos_get_the_right_suggestion() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&["serv"]);
    assert!(err.contains("similar subcommand") && err.contains("'serve'"), "{err}");
    let err = run(&["run", "--temprature", "0", "hi"]);
    assert!(err.contains("similar argument") && err.contains("--temperature"), "{err}");
    let err = run(&["bench", "--synthtic", "minicpm-sala-9b"]);
    assert!(err.contains("--synthetic"), "{err}");
}
